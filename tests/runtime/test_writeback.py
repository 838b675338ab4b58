"""The write-back buffer against a real database: a stale delivery's outcome and its
re-claim's, buffered together, are each reported as what they were."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sqlbroker
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.runtime.writeback import FlushReport, WriteBack, retry_pause


def _reclaimed(
    broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> tuple[sqlbroker.Delivery, sqlbroker.Delivery]:
    """One copy claimed, its lease expired and reaped, and claimed again: (stale, current)."""
    broker.send("jobs", {"n": 1})
    (stale,) = broker.claim("jobs", lease=5)
    clock.advance(6)
    broker.reap()
    (current,) = broker.claim("jobs", lease=5)
    assert current.id == stale.id
    assert current.lease_token != stale.lease_token
    return stale, current


def test_a_stale_outcome_and_its_reclaims_are_told_apart(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """The first lease expires and is reaped; the same copy is claimed again. Both
    completes wait in one buffer: the stale one is reported lost, the current one done,
    and the copy is completed once."""
    broker = clocked_broker
    stale, current = _reclaimed(broker, clock)

    reports: list[FlushReport] = []

    async def flush_all() -> None:
        buffer = WriteBack(broker.backend.async_ops.message_settle_many, on_flushed=reports.append)
        buffer.add(Settlement.complete(stale))
        buffer.add(Settlement.complete(current))
        assert await buffer.drain(timeout=5)

    asyncio.run(flush_all())
    lost = [o.delivery.lease_token for report in reports for o in report.lost]
    done = [o.delivery.lease_token for report in reports for o in report.done]
    assert lost == [stale.lease_token]
    assert done == [current.lease_token]
    assert [m.attempts for m in broker.archive("jobs")] == [2]


def test_one_call_may_not_settle_a_copy_twice(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """``complete([stale, current])`` cannot say which was refused: it is refused whole,
    before any write (the same delivery twice as well)."""
    broker = clocked_broker
    stale, current = _reclaimed(broker, clock)
    for batch in ([stale, current], [current, current]):
        with pytest.raises(sqlbroker.InvalidOption, match="two deliveries of copy"):
            broker.complete(batch)
        with pytest.raises(sqlbroker.InvalidOption, match="two deliveries of copy"):
            broker.release(batch)
    assert broker.archive("jobs") == []
    broker.complete(current)
    with pytest.raises(sqlbroker.LeaseLost):
        broker.complete(stale)
    assert len(broker.archive("jobs")) == 1


def test_the_pause_after_failures_is_capped_however_long_the_outage() -> None:
    """The write-back and the fetch back off by doubling; after a thousand failures in a
    row (about an hour and a half of outage at the cap) a doubling overflowed a float and
    killed the task."""
    pauses = [retry_pause(failures, first=0.1, cap=5.0) for failures in range(1, 8)]
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    for failures in (1_024, 1_100, 10**6):
        assert retry_pause(failures, first=0.1, cap=5.0) == 5.0


def test_an_outcome_after_a_quiet_spell_is_written_at_once(broker: sqlbroker.Broker) -> None:
    """At a low rate the batching window would only delay each write into the next
    message's publish and claim: an outcome that follows ``quiet`` seconds without any is
    written at once; one that follows another within ``quiet`` waits for the window."""
    window = 60.0
    broker.send_many("jobs", [1, 2])
    first, second = broker.claim("jobs", limit=2)
    written: set[int] = set()

    async def add_and_watch() -> None:
        loop = asyncio.get_running_loop()
        buffer = WriteBack(
            broker.backend.async_ops.message_settle_many,
            on_flushed=lambda report: written.update(o.delivery.id for o in report.done),
            max_delay=window,
            quiet=5.0,
        )
        stop = asyncio.Event()
        task = asyncio.ensure_future(buffer.run(stop))
        buffer.add(Settlement.complete(first))  # nothing came before it
        deadline = loop.time() + 30
        while first.id not in written and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert first.id in written, "the first outcome waited for the window"
        buffer.add(Settlement.complete(second))  # close behind the first
        await asyncio.sleep(0.5)
        assert second.id not in written, "the second outcome did not wait for the window"
        stop.set()
        await task
        assert await buffer.drain(timeout=5)

    asyncio.run(add_and_watch())
    assert written == {first.id, second.id}
    assert sorted(m.payload for m in broker.archive("jobs")) == [1, 2]


def test_an_outcome_after_a_quiet_spell_waits_while_other_claims_are_open(
    broker: sqlbroker.Broker,
) -> None:
    """A drain whose claims come back slowly has a quiet spell before each batch's first
    outcome, with the rest of the batch still open: those outcomes wait for the window
    (one write for several batches), not a write per batch."""
    broker.send_many("jobs", [1, 2])
    first, second = broker.claim("jobs", limit=2)
    written: list[set[int]] = []
    open_copies = {first.id, second.id}

    async def add_and_watch() -> None:
        buffer = WriteBack(
            broker.backend.async_ops.message_settle_many,
            on_flushed=lambda report: written.append({o.delivery.id for o in report.done}),
            max_delay=60.0,  # longer than the test: only a due write happens before the drain
            quiet=0.0,
            outstanding=lambda: len(open_copies),
        )
        stop = asyncio.Event()
        task = asyncio.ensure_future(buffer.run(stop))
        buffer.add(Settlement.complete(first))  # after a quiet spell, the second copy still open
        open_copies.discard(first.id)
        await asyncio.sleep(0.1)
        buffer.add(Settlement.complete(second))
        open_copies.discard(second.id)
        stop.set()
        await task
        assert await buffer.drain(timeout=5)

    asyncio.run(add_and_watch())
    assert written == [{first.id, second.id}], "the first outcome did not wait for the window"
    assert sorted(m.payload for m in broker.archive("jobs")) == [1, 2]


def test_a_flush_writes_mixed_outcomes_in_sub_batches_and_keeps_what_failed(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call per ``max_items`` outcomes, kinds mixed; a call that fails keeps its
    outcomes and those not tried yet, which the next flush writes."""
    broker.send_many("jobs", list(range(5)))
    claimed = broker.claim("jobs", limit=5)
    outcomes = [
        Settlement.complete(claimed[0]),
        Settlement.dead(claimed[1], "poison", None),
        Settlement.complete(claimed[2], b"2"),
        Settlement.retry(claimed[3], 60.0, None),
        Settlement.cancel(claimed[4]),
    ]
    calls: list[list[str]] = []
    reports: list[FlushReport] = []

    async def settle(*, settlements: Any) -> list[int]:
        calls.append([s.kind for s in settlements])
        if len(calls) == 2:
            raise sqlbroker.ConnectionLost("injected", ambiguous=False)
        return await broker.backend.async_ops.message_settle_many(settlements=settlements)

    async def flush_twice() -> None:
        buffer = WriteBack(settle, on_flushed=reports.append, max_items=2)
        for outcome in outcomes:
            buffer.add(outcome)
        assert not await buffer.flush()
        assert len(buffer) == 3
        assert await buffer.flush()
        assert len(buffer) == 0

    asyncio.run(flush_twice())
    assert calls == [
        ["complete", "dead"],
        ["complete", "retry"],
        ["complete", "retry"],
        ["cancel"],
    ]
    assert [len(report.done) for report in reports] == [2, 3]
    assert not [o for report in reports for o in report.lost]
    archived = {row.payload: row.outcome.value for row in broker.archive("jobs")}
    assert archived == {0: "completed", 2: "completed", 4: "cancelled"}
    assert [d.payload for d in broker.dead_letters.list()] == [1]
    assert [p.state.value for p in broker.pending("jobs")] == ["scheduled"]


def test_a_complete_of_a_delivery_is_the_named_tuple_its_fields_say(
    broker: sqlbroker.Broker,
) -> None:
    """``Settlement.complete`` builds its tuples without the named tuples' constructors:
    they must equal what the constructors build, field for field."""
    broker.send("jobs", {"n": 1})
    (delivery,) = broker.claim("jobs")
    for value in (None, b'{"ok":true}'):
        built = Settlement.complete(delivery, value)
        lease = Lease(delivery.id, delivery.lease_token)
        assert built == Settlement("complete", lease, value, delivery=delivery)
        assert built._asdict() == {
            "kind": "complete",
            "lease": lease,
            "value": value,
            "after": 0.0,
            "snooze": False,
            "reason": "",
            "error": None,
            "delivery": delivery,
        }
        assert (type(built), type(built.lease)) == (Settlement, Lease)
