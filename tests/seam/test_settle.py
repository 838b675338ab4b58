"""Settling leased copies through the seam: one ``message_settle_many`` takes completes
(with and without results), retries, snoozes, dead letters and cancels mixed, on both
dialects, alone or inside one transaction."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from tests.seam.support import claim, publish

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import DatabaseBusy, InvalidOption
from sqlbroker.core.message import ErrorInfo
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.storage.base import DeadFilter
from sqlbroker.storage.factory import open_backend

ERROR = ErrorInfo(type="KeyError", message="k", traceback="tb")


def states(backend: Any, queue: str) -> dict[str, str]:
    """Message id -> state of the copies in the hot table."""
    rows = backend.message_list(subscription=queue, state=None, limit=50)
    return {m.message_id: m.state.value for m in rows}


def outcomes(backend: Any, queue: str) -> dict[str, str]:
    """Message id -> outcome of the archived copies."""
    rows = backend.archive_list(subscription=queue, outcome=None, message_id=None, limit=50)
    return {row.message_id: row.outcome.value for row in rows}


def dead_letters(backend: Any) -> list[Any]:
    return list(backend.dead_list(where=DeadFilter(), limit=50, after_id=None))


def mixed(deliveries: list[Any]) -> list[Settlement]:
    done, valued, failed, snoozed, poisoned, cancelled = (Lease.of(d) for d in deliveries)
    return [
        Settlement.complete(done),
        Settlement.complete(valued, b'{"total": 3}'),
        Settlement.retry(failed, 10, ERROR),
        Settlement.retry(snoozed, 0, snooze=True),
        Settlement.dead(poisoned, "poison", ERROR),
        Settlement.cancel(cancelled),
    ]


def test_one_call_settles_every_kind_and_returns_the_valid_leases(
    backend: Any, clock: ManualClock
) -> None:
    ids = publish(backend, "jobs", 7)
    deliveries = claim(backend, "jobs", 7)
    assert [d.message_id for d in deliveries] == ids
    stale = Settlement.complete(Lease(deliveries[6].id, "not-the-token"))

    done = backend.message_settle_many(settlements=[*mixed(deliveries[:6]), stale])

    assert done == sorted(d.id for d in deliveries[:6])
    completed, valued, failed, snoozed, poisoned, cancelled, untouched = deliveries
    assert outcomes(backend, "jobs") == {
        completed.message_id: "completed",
        valued.message_id: "completed",
        cancelled.message_id: "cancelled",
    }
    assert states(backend, "jobs") == {
        failed.message_id: "scheduled",
        snoozed.message_id: "available",
        untouched.message_id: "running",
    }
    (dead,) = dead_letters(backend)
    assert (dead.message_id, dead.reason, dead.error_type, dead.traceback) == (
        poisoned.message_id,
        "poison",
        "KeyError",
        "tb",
    )
    (stored,) = [r for r in backend.result_lookup(message_id=ids[1]) if r.value is not None]
    assert stored.value == b'{"total": 3}'
    assert not [r for r in backend.result_lookup(message_id=ids[0]) if r.value is not None]
    rows = backend.message_list(subscription="jobs", state=None, limit=9)
    (retried,) = [m for m in rows if m.message_id == failed.message_id]
    assert "KeyError" in (retried.last_error or "")
    # The snooze gave its attempt back; the failure kept it and waits its delay.
    (again,) = claim(backend, "jobs")
    assert (again.id, again.attempt) == (snoozed.id, 1)
    clock.advance(11)
    (later,) = claim(backend, "jobs")
    assert (later.id, later.attempt) == (failed.id, 2)


def test_a_settlement_that_removes_a_head_promotes_the_next_copy_of_its_key(
    backend: Any,
) -> None:
    for key in ("a", "b", "c", "d"):
        publish(backend, "jobs", 2, key=key)
    heads = claim(backend, "jobs", 10)
    assert len(heads) == 4
    by_key = {d.key: Lease.of(d) for d in heads}
    done = backend.message_settle_many(
        settlements=[
            Settlement.complete(by_key["a"], b"1"),
            Settlement.dead(by_key["b"], "poison"),
            Settlement.cancel(by_key["c"]),
            Settlement.retry(by_key["d"], 0),
        ]
    )
    assert len(done) == 4
    # a, b and c left the table and their next copies are available; d's head is back.
    assert sorted(states(backend, "jobs").values()) == ["available"] * 4 + ["blocked"]


def test_a_copy_twice_in_one_call_is_refused_and_nothing_is_written(backend: Any) -> None:
    publish(backend, "jobs", 2)
    first, second = claim(backend, "jobs", 2)
    twice = [
        Settlement.complete(Lease.of(second)),
        Settlement.complete(Lease.of(first)),
        Settlement.dead(Lease.of(first), "x"),
    ]
    with pytest.raises(InvalidOption, match=f"copy {first.id} twice"):
        backend.message_settle_many(settlements=twice)
    assert set(states(backend, "jobs").values()) == {"running"}
    unknown = Settlement("archive", Lease.of(first))  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="'archive'"):
        backend.message_settle_many(settlements=[Settlement.complete(Lease.of(second)), unknown])
    assert set(states(backend, "jobs").values()) == {"running"}
    assert backend.message_settle_many(settlements=[]) == []


def test_a_dead_letter_reason_is_made_storable(backend: Any) -> None:
    publish(backend, "jobs")
    (delivery,) = claim(backend, "jobs")
    dead_letter = Settlement.dead(Lease.of(delivery), "bad\x00" + "x" * 5000)
    assert backend.message_settle_many(settlements=[dead_letter]) == [delivery.id]
    (dead,) = dead_letters(backend)
    assert "\x00" not in dead.reason
    assert len(dead.reason) <= 1000


def test_a_mixed_batch_inside_a_transaction_commits_or_rolls_back_whole(backend: Any) -> None:
    publish(backend, "jobs", 6)
    deliveries = claim(backend, "jobs", 6)
    written: list[int] = []
    try:
        with backend.begin() as tx:
            written = tx.message_settle_many(settlements=mixed(deliveries))
            raise RuntimeError("undone")
    except RuntimeError:
        pass
    assert len(written) == 6
    assert set(states(backend, "jobs").values()) == {"running"}
    assert outcomes(backend, "jobs") == {}
    assert dead_letters(backend) == []
    with backend.begin() as tx:
        assert len(tx.message_settle_many(settlements=mixed(deliveries))) == 6
    assert sorted(outcomes(backend, "jobs").values()) == ["cancelled", "completed", "completed"]
    assert len(dead_letters(backend)) == 1


def test_the_async_executor_runs_the_same_plan(backend: Any) -> None:
    publish(backend, "jobs", 6)
    deliveries = claim(backend, "jobs", 6)

    async def main() -> list[int]:
        try:
            done: list[int] = await backend.async_ops.message_settle_many(
                settlements=mixed(deliveries)
            )
            return done
        finally:
            if hasattr(backend, "close_async"):
                await backend.close_async()

    assert asyncio.run(main()) == sorted(d.id for d in deliveries)
    assert sorted(outcomes(backend, "jobs").values()) == ["cancelled", "completed", "completed"]


def test_postgresql_announces_results_dead_letters_and_ready_retries_at_commit(
    backend: Any, backend_url: str
) -> None:
    if not backend_url.startswith("postgresql"):
        pytest.skip("SQLite has no NOTIFY (its watchers poll data_version)")
    import psycopg

    settings = backend.settings
    ids = publish(backend, "jobs", 6)
    deliveries = claim(backend, "jobs", 6)
    with psycopg.connect(backend_url, autocommit=True) as listener:
        for channel in (settings.notify_channel, settings.dead_channel, settings.result_channel):
            listener.execute(f'LISTEN "{channel}"')
        backend.message_settle_many(settlements=mixed(deliveries))
        heard = {(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=3)}
    assert heard == {
        (settings.result_channel, ids[1]),  # the complete with a value
        (settings.dead_channel, "jobs"),  # the dead letter
        (settings.notify_channel, "jobs"),  # the snooze, available at once
    }


def test_plain_completes_archive_and_remove_exactly_the_valid_leases(backend: Any) -> None:
    """SQLite reads a complete's removed copies back from the archive rows it just wrote
    (queries.sql message_complete): a batch with lost leases, or only lost ones, after
    other archive rows and inserts on the connection, must touch no other copy."""
    publish(backend, "jobs", 3)
    earlier = claim(backend, "jobs", 3)
    assert backend.message_settle_many(
        settlements=[Settlement.complete(Lease.of(d)) for d in earlier]
    ) == sorted(d.id for d in earlier)
    publish(backend, "jobs", 3)
    kept, done, lost = claim(backend, "jobs", 3)
    stale = [Settlement.complete(Lease(d.id, "not-the-token")) for d in (kept, lost)]

    assert backend.message_settle_many(settlements=stale) == []
    assert backend.message_settle_many(
        settlements=[Settlement.complete(Lease.of(done)), stale[1]]
    ) == [done.id]
    with backend.begin() as tx:
        assert tx.message_settle_many(settlements=stale) == []

    assert states(backend, "jobs") == {kept.message_id: "running", lost.message_id: "running"}
    archived = backend.archive_list(subscription="jobs", outcome=None, message_id=None, limit=50)
    assert sorted(row.message_id for row in archived) == sorted(
        [d.message_id for d in earlier] + [done.message_id]
    )


@pytest.mark.parametrize("held", ["lease", "delivery"])
@pytest.mark.parametrize("kind", ["complete", "dead"])
@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_settle_whose_promotion_fails_after_it_committed_reports_its_copies_settled(
    pg_url: str, face: str, kind: str, held: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL settles alone in autocommit: the complete (or dead letter) commits, then
    the key's promotion runs. When the promotion fails (here ``lock_timeout`` on the next
    copy, held by another session; a deadlock in CI), the settle still reports the copy
    settled — it used to fail, so the write-back retried it, found the copy gone and the
    worker reported its lease lost — and the key waits for the reaper's key repair. In a
    transaction the failure undoes the settle and reaches the caller. Settled as bare
    leases (``broker.complete``) and as the worker settles, with their deliveries."""
    backend = open_backend(pg_url, lock_timeout=0.2, clock=ManualClock())
    try:
        publish(backend, "jobs", 1)
        second = publish(backend, "jobs", 2, key="k")[1]
        unkeyed, head = claim(backend, "jobs", 5)
        settlements = [
            Settlement.complete(d if held == "delivery" else Lease.of(d))
            if kind == "complete"
            else Settlement.dead(d if held == "delivery" else Lease.of(d), "poison")
            for d in (unkeyed, head)
        ]
        with psycopg.connect(pg_url) as holder:
            holder.execute(
                "SELECT 1 FROM sqlbroker_message WHERE message_id = %s FOR UPDATE", (second,)
            )
            with pytest.raises(DatabaseBusy, match="lock_timeout"), backend.begin() as tx:
                tx.message_settle_many(settlements=settlements)
            assert states(backend, "jobs")[head.message_id] == "running"  # undone
            with caplog.at_level(logging.WARNING, logger="sqlbroker.storage"):
                if face == "sync":
                    done = backend.message_settle_many(settlements=settlements)
                else:
                    done = asyncio.run(_settle_async(backend, settlements))
        assert done == sorted([unkeyed.id, head.id])
        assert "key repair" in caplog.text
        assert states(backend, "jobs") == {second: "blocked"}
        assert claim(backend, "jobs") == []
        assert backend.key_repair(limit=10) == 1
        assert [d.message_id for d in claim(backend, "jobs")] == [second]
    finally:
        backend.close()


@pytest.mark.parametrize("held", ["lease", "delivery"])
@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_plain_complete_promotes_the_next_copies_of_its_keys_in_its_own_statement(
    pg_url: str, face: str, held: str
) -> None:
    """PostgreSQL: a complete without results (the drain's) gives each key whose head it
    completed the next copy in the same statement, not in a statement and commit of its
    own after it: the archive rows and the promoted copies carry one transaction id.
    Settled as bare leases (``broker.complete``) and with their deliveries (the worker)."""
    backend = open_backend(pg_url)
    try:
        first_a, second_a = publish(backend, "jobs", 2, key="a")
        first_b, second_b = publish(backend, "jobs", 2, key="b")
        heads = claim(backend, "jobs")
        assert sorted(d.message_id for d in heads) == sorted([first_a, first_b])
        settlements = [Settlement.complete(d if held == "delivery" else Lease.of(d)) for d in heads]
        if face == "sync":
            done = backend.message_settle_many(settlements=settlements)
        else:
            done = asyncio.run(_settle_async(backend, settlements))
        assert done == sorted(d.id for d in heads)
        assert states(backend, "jobs") == {second_a: "available", second_b: "available"}
        with psycopg.connect(pg_url, autocommit=True) as conn:
            written = conn.execute(
                "SELECT xmin::text FROM sqlbroker_archive WHERE message_id::text = ANY(%s)"
                " UNION ALL"
                " SELECT xmin::text FROM sqlbroker_message WHERE message_id::text = ANY(%s)",
                ([first_a, first_b], [second_a, second_b]),
            ).fetchall()
        assert len(written) == 4
        assert len(set(written)) == 1
    finally:
        backend.close()


async def _settle_async(backend: Any, settlements: list[Settlement]) -> list[int]:
    try:
        done: list[int] = await backend.async_ops.message_settle_many(settlements=settlements)
        return done
    finally:
        await backend.close_async()
