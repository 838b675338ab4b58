"""The checker itself: each kind of fault it must catch, planted in a hand-written history."""

from __future__ import annotations

from typing import Any

from reliability.checker import FinalRow, check

SUB = "jobs"


def ev(op: str, mono: float, **fields: Any) -> dict[str, Any]:
    return {"op": op, "mono": mono, "pid": fields.pop("pid", 10), "proc": "t", **fields}


def publish(tag: str, mono: float, status: str = "ok", **fields: Any) -> dict[str, Any]:
    return ev("publish", mono, tag=tag, status=status, id=f"m-{tag}", ikey=tag, **fields)


def delivery(
    tag: str, attempt: int, mono: float, *, pid: int = 10, end: str = "complete", token: str = ""
):
    common = {"id": f"m-{tag}", "delivery": 1, "attempt": attempt, "sub": SUB, "pid": pid}
    common["token"] = token or f"t{attempt}"
    events = [ev("deliver", mono, tag=tag, key=None, **common)]
    if end in {"complete", "retry"}:
        events.append(ev("handled", mono + 0.1, error=None if end == "complete" else "E", **common))
        events.append(ev("settled", mono + 0.2, kind=end, **common))
    return events


def row(tag: str, state: str = "completed") -> FinalRow:
    return FinalRow(f"m-{tag}", SUB, state, tag)


def test_a_clean_history_is_clean() -> None:
    events = [publish("a", 0), *delivery("a", 1, 1, end="retry"), *delivery("a", 2, 2)]
    verdict = check(events, [row("a")], subscriptions=[SUB])
    verdict.assert_clean()
    assert verdict.duplicates == {"explicit retry": 1}


def test_lost_unexpected_and_recovered() -> None:
    events = [
        publish("lost", 0),
        publish("failed", 0, status="failed"),
        publish("maybe", 0, status="ambiguous"),
    ]
    rows = [row("lost", "pending:available"), row("failed"), row("maybe"), row("stranger")]
    verdict = check(events, rows, subscriptions=[SUB])
    assert verdict.lost == ["lost@jobs: pending:available"]
    assert len(verdict.unexpected) == 2
    assert verdict.recovered == ["maybe"]


def test_an_unexplained_redelivery_and_a_kill() -> None:
    events = [publish("a", 0), *delivery("a", 1, 1, end="none"), *delivery("a", 2, 5)]
    assert check(events, [row("a")], subscriptions=[SUB]).unexplained
    killed = [*events, ev("fault", 2, kind="kill", target=10)]
    verdict = check(killed, [row("a")], subscriptions=[SUB])
    verdict.assert_clean()
    assert verdict.duplicates == {"worker killed": 1}


def test_two_completions_and_overlapping_leases() -> None:
    events = [publish("a", 0), *delivery("a", 1, 1), *delivery("a", 2, 1.05, pid=11)]
    verdict = check(events, [row("a")], subscriptions=[SUB])
    assert verdict.double_completions
    assert verdict.overlaps


def test_order_per_key() -> None:
    events = []
    for seq, (tag, mono) in enumerate([("k0", 3.0), ("k1", 1.0)]):
        events.append(publish(tag, seq, key="k", seq=seq))
        events.extend(delivery(tag, 1, mono))
    verdict = check(events, [row("k0"), row("k1")], subscriptions=[SUB])
    assert verdict.order == ["k@jobs: completed in order [1, 0]"]


def test_a_foreign_exception_is_reported() -> None:
    events = [publish("a", 0, status="foreign", error="OperationalError: boom")]
    assert check(events, [], subscriptions=[SUB]).foreign_errors


def test_a_publish_names_the_subscriptions_it_must_reach() -> None:
    other = FinalRow("m-b", "later", "cancelled", "b")
    events = [publish("a", 0), publish("b", 0, subs=["later"])]
    verdict = check(events, [row("a"), other], subscriptions=[SUB])
    verdict.assert_clean()
    assert verdict.published == 2
    lost = check(events, [row("a"), row("b")], subscriptions=[SUB])
    assert lost.lost == ["b@later: missing"]


def test_a_worker_that_ends_itself_explains_the_redelivery() -> None:
    events = [publish("a", 0), *delivery("a", 1, 1, end="none"), *delivery("a", 2, 5, pid=11)]
    exited = [*events, ev("fault", 1.5, kind="exit", target=10)]
    verdict = check(exited, [row("a")], subscriptions=[SUB])
    verdict.assert_clean()
    assert verdict.duplicates == {"worker exited": 1}


def test_a_stale_attempt_started_after_a_pause() -> None:
    """Attempt 1 was claimed, its worker paused before the handler began; attempt 2 ran on
    another worker meanwhile; attempt 1's handler starts after the resume and its ack is
    refused. Without the pause the late start is unexplained; had attempt 1 settled, two
    leases would have overlapped."""
    stale = {"id": "m-a", "delivery": 1, "attempt": 1, "sub": SUB, "pid": 10, "token": "t1"}
    late_start = [
        ev("deliver", 4.0, tag="a", key=None, **stale),
        ev("handled", 4.1, error=None, **stale),
    ]
    events = [publish("a", 0), *delivery("a", 2, 3.0, pid=11), *late_start]
    refused = [*events, ev("settle_lost", 4.2, kind="complete", **stale)]
    paused = [
        *events,
        ev("fault", 1.0, kind="stop", target=10),
        ev("fault", 3.5, kind="cont", target=10),
    ]
    assert check(events, [row("a")], subscriptions=[SUB]).unexplained
    verdict = check(paused, [row("a")], subscriptions=[SUB])
    verdict.assert_clean()
    assert verdict.duplicates == {"worker paused": 1}
    # A refused ack is the system doing right, but it needs a cause of its own.
    assert check(refused, [row("a")], subscriptions=[SUB]).unexplained
    settled = [*paused, ev("settled", 4.2, kind="complete", **stale)]
    verdict = check(settled, [row("a")], subscriptions=[SUB])
    assert verdict.overlaps
    assert verdict.double_completions


def test_a_handler_started_between_the_kill_record_and_the_signal() -> None:
    """The fault is recorded just before the signal is sent: a handler may start between."""
    events = [publish("a", 0), *delivery("a", 1, 1.001, end="none"), *delivery("a", 2, 5)]
    killed = [*events, ev("fault", 1.0, kind="kill", target=10)]
    verdict = check(killed, [row("a")], subscriptions=[SUB])
    verdict.assert_clean()
    assert verdict.duplicates == {"worker killed": 1}
    late = [*events, ev("fault", 6.0, kind="kill", target=10)]
    assert check(late, [row("a")], subscriptions=[SUB]).unexplained


def test_an_expired_lease_is_shown_by_the_database_times() -> None:
    """Attempt 1's lease (1 s, claimed at 100.0) ended at 101.0; its ack was refused. A
    next claim at 101.2 shows the lease expired; one at 100.5 found it still valid: two
    leases at once (the signature of the key-repair race), unexplained however the ack
    went. Without the lease, no redelivery is put down to expiry."""
    first = {"id": "m-a", "delivery": 1, "attempt": 1, "sub": SUB, "pid": 10, "token": "t1"}
    second = {"id": "m-a", "delivery": 1, "attempt": 2, "sub": SUB, "pid": 11, "token": "t2"}

    def history(next_claim: float) -> list[dict[str, Any]]:
        return [
            publish("a", 0),
            ev("deliver", 1.0, tag="a", key=None, leased_until=101.0, **first),
            ev("deliver", 2.0, tag="a", key=None, leased_until=next_claim + 1, **second),
            ev("handled", 2.1, error=None, **first),
            ev("settle_lost", 2.2, kind="complete", **first),
            ev("handled", 2.3, error=None, **second),
            ev("settled", 2.4, kind="complete", **second),
        ]

    verdict = check(history(101.2), [row("a")], subscriptions=[SUB], lease=1.0)
    verdict.assert_clean()
    assert verdict.duplicates == {"lease expired": 1}
    assert check(history(100.5), [row("a")], subscriptions=[SUB], lease=1.0).unexplained
    assert check(history(101.2), [row("a")], subscriptions=[SUB]).unexplained


def test_a_claim_a_restart_forgot() -> None:
    """A claim at 100.0 (database clock, lease 1 s) is not flushed when the server is
    restarted at 100.3: the next claim is attempt 1 again, under a new lease. That restart
    explains it; one long before, or a terminated session (the server kept running), does
    not."""
    first = {"id": "m-a", "delivery": 1, "attempt": 1, "sub": SUB, "pid": 10, "token": "t1"}
    events = [
        publish("a", 0),
        ev("deliver", 1.0, tag="a", key=None, leased_until=101.0, **first),
        ev("handled", 1.1, error=None, **first),
        ev("settle_lost", 2.0, kind="complete", **first),
        *delivery("a", 1, 3.0, pid=11, token="t2"),
    ]
    events[-3]["leased_until"] = 101.5  # claimed at 100.5: the first lease was still valid

    def restart(kind: str, wall: float) -> dict[str, Any]:
        return ev("fault", 0.5, kind=kind, target="server", wall=wall)

    verdict = check(
        [*events, restart("restart", 100.3)], [row("a")], subscriptions=[SUB], lease=1.0
    )
    verdict.assert_clean()
    assert verdict.duplicates == {"claim forgotten by a restart": 1}
    for other in (restart("restart", 90.0), restart("terminate", 100.3)):
        assert check([*events, other], [row("a")], subscriptions=[SUB], lease=1.0).unexplained
