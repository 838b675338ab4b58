"""Leased copies through the seam: claim, retry, dead-letter, extend, release, cancel, and
the reaper's operations, on both dialects and inside one transaction."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from tests.seam.support import claim, new_message, publish

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.message import ErrorInfo, State
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.storage.base import DeadFilter


def states(backend: Any, queue: str) -> list[str]:
    return [m.state.value for m in backend.message_list(subscription=queue, state=None, limit=50)]


def test_a_claim_leases_the_most_urgent_copies_and_counts_the_attempt(backend: Any) -> None:
    publish(backend, "jobs", 3)
    first = claim(backend, "jobs", 2)
    assert [d.attempt for d in first] == [1, 1]
    assert first[0].id < first[1].id
    assert len(claim(backend, "jobs", 5)) == 1
    assert claim(backend, "jobs") == []


def test_a_stale_token_settles_nothing(backend: Any) -> None:
    publish(backend, "jobs")
    (delivery,) = claim(backend, "jobs")
    stale = Lease(id=delivery.id, token="0" * 32)
    assert backend.message_settle_many(settlements=[Settlement.retry(stale, 0)]) == []
    assert backend.message_settle_many(settlements=[Settlement.dead(stale, "x")]) == []
    assert backend.message_extend_leases(leases=[stale], lease=60) == {}
    assert backend.message_release_many(leases=[stale]) == []
    assert states(backend, "jobs") == ["running"]


def test_retry_waits_its_delay_and_a_snooze_gives_the_attempt_back(
    backend: Any, clock: ManualClock
) -> None:
    publish(backend, "jobs", 2)
    failed, snoozed = claim(backend, "jobs", 2)
    error = ErrorInfo(type="ValueError", message="bad", traceback=None)
    done = backend.message_settle_many(
        settlements=[
            Settlement.retry(Lease.of(failed), 10, error),
            Settlement.retry(Lease.of(snoozed), 0, snooze=True),
        ]
    )
    assert done == sorted([failed.id, snoozed.id])
    (again,) = claim(backend, "jobs")
    assert (again.id, again.attempt) == (snoozed.id, 1)
    clock.advance(11)
    (later,) = claim(backend, "jobs")
    assert (later.id, later.attempt) == (failed.id, 2)


def test_dead_lettering_promotes_the_next_copy_of_its_ordering_key(backend: Any) -> None:
    publish(backend, "jobs", 2, key="customer-1")
    assert states(backend, "jobs") == ["available", "blocked"]
    (head,) = claim(backend, "jobs", 5)
    error = ErrorInfo(type="KeyError", message="k", traceback="tb")
    dead_letter = Settlement.dead(Lease.of(head), "poison", error)
    assert backend.message_settle_many(settlements=[dead_letter]) == [head.id]
    assert states(backend, "jobs") == ["available"]
    (dead,) = backend.dead_list(where=DeadFilter(), limit=5, after_id=None)
    assert (dead.reason, dead.error_type, dead.traceback) == ("poison", "KeyError", "tb")


def test_extend_and_release(backend: Any, clock: ManualClock) -> None:
    publish(backend, "jobs", 2)
    kept, given_back = claim(backend, "jobs", 2)
    extended = backend.message_extend_leases(leases=[Lease.of(kept)], lease=120)
    assert set(extended) == {kept.id}
    assert extended[kept.id] > kept.lease_expires_at
    assert backend.message_release_many(leases=[Lease.of(given_back)]) == [given_back.id]
    (again,) = claim(backend, "jobs")
    assert (again.id, again.attempt) == (given_back.id, 1)


def test_cancel_archives_copies_not_running_and_flags_running_ones(backend: Any) -> None:
    running_id, waiting_id = publish(backend, "jobs", 2)
    (running,) = claim(backend, "jobs", 1)
    assert backend.message_cancel_requested(ids=[running.id]) == []
    assert backend.message_cancel_many(message_ids=[running_id, waiting_id], actor="ops") == 2
    assert states(backend, "jobs") == ["running"]
    assert backend.message_cancel_requested(ids=[running.id, running.id + 1000]) == [running.id]
    # The worker that ran it archives it as cancelled; a stale lease changes nothing.
    stale = Lease(running.id, "not-the-token")
    assert backend.message_settle_many(settlements=[Settlement.cancel(stale)]) == []
    cancel = Settlement.cancel(Lease.of(running))
    assert backend.message_settle_many(settlements=[cancel]) == [running.id]
    assert states(backend, "jobs") == []
    outcomes = [
        row.outcome.value
        for row in backend.archive_list(
            subscription="jobs", outcome=None, message_id=None, limit=10
        )
    ]
    assert outcomes == ["cancelled", "cancelled"]


def test_the_reaper_returns_lost_leases_and_quarantines_spent_ones(
    backend: Any, clock: ManualClock
) -> None:
    spent = new_message("jobs", max_attempts=1)
    backend.message_insert_many(messages=[spent], subscription="jobs")
    publish(backend, "jobs")
    claim(backend, "jobs", 2)
    clock.advance(31)
    result = backend.lease_release_expired(limit=10)
    assert (result.released, result.dead) == (1, 1)
    (dead,) = backend.dead_list(where=DeadFilter(), limit=5, after_id=None)
    assert dead.error_type == "sqlbroker.WorkerLost"
    assert states(backend, "jobs") == ["available"]


def test_a_spent_copy_the_reaper_did_not_dead_letter_is_never_released(
    backend: Any, clock: ManualClock
) -> None:
    """A spent copy left over by the dead-letter statement (here beyond the limit) stays
    running for the next pass: released, it would be claimed past its last attempt."""
    spent = [new_message("jobs", max_attempts=1) for _ in range(2)]
    backend.message_insert_many(messages=spent, subscription="jobs")
    claim(backend, "jobs", 2)
    clock.advance(31)
    result = backend.lease_release_expired(limit=1)
    assert (result.released, result.dead) == (0, 1)
    assert states(backend, "jobs") == ["running"]
    assert claim(backend, "jobs") == []
    result = backend.lease_release_expired(limit=1)
    assert (result.released, result.dead) == (0, 1)
    assert len(backend.dead_list(where=DeadFilter(), limit=5, after_id=None)) == 2
    assert states(backend, "jobs") == []


def test_ttls_expire_and_dedupe_keys_trim(backend: Any, clock: ManualClock) -> None:
    message = new_message("jobs")
    fields = {f: getattr(message, f) for f in message.__slots__}
    fields.update(ttl=5.0, idempotency_key="once", payload_hash="h", dedupe_window=10.0)
    backend.message_insert_many(messages=[type(message)(**fields)], subscription="jobs")
    assert backend.message_expire(limit=10) == 0
    clock.advance(6)
    assert backend.message_expire(limit=10) == 1
    assert backend.message_list(subscription="jobs", state=State.AVAILABLE, limit=5) == []
    assert backend.dedupe_trim(limit=10) == 0
    clock.advance(5)
    assert backend.dedupe_trim(limit=10) == 1
    assert backend.key_repair(limit=10) == 0


def test_settling_inside_a_transaction_commits_with_it(backend: Any) -> None:
    publish(backend, "jobs", 2)
    first, second = claim(backend, "jobs", 2)
    try:
        with backend.begin() as tx:
            tx.message_settle_many(settlements=[Settlement.dead(Lease.of(first), "x")])
            raise RuntimeError("undone")
    except RuntimeError:
        pass
    assert states(backend, "jobs") == ["running", "running"]
    with backend.begin() as tx:
        tx.message_release_many(leases=[Lease.of(first)])
        tx.message_settle_many(settlements=[Settlement.retry(Lease.of(second), 0)])
    assert states(backend, "jobs") == ["available", "available"]


def test_the_async_claim_runs_the_same_plan(backend: Any) -> None:
    publish(backend, "jobs", 3)

    async def main() -> list[Any]:
        claimed = await backend.async_ops.message_claim_many(
            subscription="jobs", limit=2, lease=30, worker="async"
        )
        await backend.async_ops.message_release_many(leases=[Lease.of(d) for d in claimed])
        if hasattr(backend, "close_async"):
            await backend.close_async()
        return list(claimed)

    assert len(asyncio.run(main())) == 2
    assert states(backend, "jobs") == ["available"] * 3


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_claim_takes_its_promotion_of_due_delayed_copies_along_on_postgresql(
    backend: Any, backend_url: str, clock: ManualClock, face: str
) -> None:
    """The promotion a claim runs first (when due) travels with the claim: one round trip,
    so one implicit transaction — both rows it changed carry the same transaction id.
    Sent on its own, it cost a worker's wake-up a round trip in front of the claim."""
    if not backend_url.startswith("postgresql"):
        pytest.skip("SQLite has no round trips to save: a write runs in one transaction")
    publish(backend, "jobs", 2)
    delayed, ready = claim(backend, "jobs", 2)
    backend.message_settle_many(
        settlements=[
            Settlement.retry(Lease.of(delayed), 10),  # scheduled, due in 10 s
            Settlement.retry(Lease.of(ready), 0),  # available at once: claimed first
        ]
    )
    clock.advance(11)  # the delayed copy is due, and so is the claim's promotion
    if face == "sync":
        (claimed,) = claim(backend, "jobs", 1)
    else:
        (claimed,) = asyncio.run(
            backend.async_ops.message_claim_many(
                subscription="jobs", limit=1, lease=30, worker="seam-test"
            )
        )
    assert claimed.id == ready.id
    with psycopg.connect(backend_url, autocommit=True) as conn:
        rows = dict(
            conn.execute(
                "SELECT id, xmin::text FROM sqlbroker_message WHERE id = ANY(%s)",
                [[delayed.id, ready.id]],
            ).fetchall()
        )
    assert states(backend, "jobs") == ["available", "running"]  # promoted, claimed
    assert rows[delayed.id] == rows[ready.id]
