"""Observability through the seam: heartbeats, per-minute counters, lifetime totals, rare
archive counts, trimming and the audit trail."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import sqlbroker
from sqlbroker.core.clock import ManualClock
from sqlbroker.core.observability import HANDLER_BUCKETS, MinuteCounts, WorkerBeat

START = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def beat(name: str = "w1", **changes: Any) -> WorkerBeat:
    return WorkerBeat(name=name, host="h", pid=42, subscriptions=("a", "b"), **changes)


def minute(worker: str = "w1", *, at: datetime = START, completed: int = 1) -> MinuteCounts:
    buckets = [0] * len(HANDLER_BUCKETS)
    buckets[0] = completed
    return MinuteCounts(
        subscription="a",
        minute=at,
        worker=worker,
        completed=completed,
        retried=2,
        dead=3,
        handler_count=completed,
        handler_seconds=0.25 * completed,
        handler_buckets=buckets,
    )


def test_a_beat_records_the_worker_its_minutes_and_adds_totals(
    backend: Any, clock: ManualClock
) -> None:
    seen = backend.worker_beat(
        beat=beat(starting=True), minutes=[minute()], totals={("a", "completed"): 1}
    )
    assert seen == START
    clock.advance(30)
    # Minutes are absolute (written again, they change nothing); totals are deltas.
    again = backend.worker_beat(
        beat=beat(), minutes=[minute(completed=4)], totals={("a", "completed"): 2, ("a", "x"): 0}
    )
    assert again == START + timedelta(seconds=30)
    (worker,) = backend.worker_list()
    assert (worker.name, worker.host, worker.pid, worker.subscriptions) == (
        "w1",
        "h",
        42,
        ("a", "b"),
    )
    assert (worker.started_at, worker.seen_at, worker.stopped_at) == (START, again, None)
    assert worker.seen_age == pytest.approx(0)
    assert worker.damaged is None
    assert backend.metric_minutes(since=START) == [minute(completed=4)]
    assert backend.metric_minutes(since=START + timedelta(minutes=1)) == []
    assert backend.metric_totals() == {("a", "completed"): 3}
    clock.advance(10)
    backend.worker_beat(beat=beat(stopping=True), minutes=[], totals={})
    (stopped,) = backend.worker_list()
    assert stopped.started_at == START  # only a starting beat resets it
    assert stopped.stopped_at == START + timedelta(seconds=40)


def test_workers_are_listed_most_recently_seen_first(backend: Any, clock: ManualClock) -> None:
    backend.worker_beat(beat=beat("old"), minutes=[], totals={})
    clock.advance(5)
    backend.worker_beat(beat=beat("new"), minutes=[], totals={})
    clock.advance(1)
    listed = backend.worker_list()
    assert [w.name for w in listed] == ["new", "old"]
    assert [w.seen_age for w in listed] == [pytest.approx(1), pytest.approx(6)]


def test_trim_removes_old_minutes_and_workers(backend: Any, clock: ManualClock) -> None:
    backend.worker_beat(
        beat=beat("gone"),
        minutes=[minute("gone"), minute("gone", at=START + timedelta(minutes=1))],
        totals={},
    )
    clock.advance(3600)
    backend.worker_beat(beat=beat("here"), minutes=[minute("here", at=clock.now())], totals={})
    cutoff = START + timedelta(minutes=30)
    assert backend.metric_trim(older_than=cutoff, limit=1) == 2  # one minute, one worker
    assert backend.metric_trim(older_than=cutoff, limit=10) == 1
    assert backend.metric_trim(older_than=cutoff, limit=10) == 0
    assert [w.name for w in backend.worker_list()] == ["here"]
    assert [m.worker for m in backend.metric_minutes(since=START)] == ["here"]


def test_rare_counts_and_the_audit_trail(
    backend: Any, backend_url: str, clock: ManualClock
) -> None:
    assert backend.archive_rare_counts(since=START) == []
    assert backend.audit_list(limit=10, before_id=None) == []
    with sqlbroker.Broker(backend_url, clock=clock) as broker:
        broker.publish("nowhere.at.all", {"n": 1})  # no subscription: archived unrouted
        for n in range(3):
            broker.send("jobs", {"n": n})
        for delivery in broker.claim("jobs", limit=3):
            broker.dead_letter(delivery, reason="bad")
        dead = broker.dead_letters.list()
        for entry in dead:
            broker.dead_letters.purge([entry.id], actor="ops", note="junk")
    (rare,) = backend.archive_rare_counts(since=START)
    assert (rare.subscription, rare.outcome, rare.total, rare.recent) == (None, "unrouted", 1, 1)
    assert backend.archive_rare_counts(since=START + timedelta(seconds=1))[0].recent == 0
    audit = backend.audit_list(limit=10, before_id=None)
    assert len(audit) == 3
    assert [entry.id for entry in audit] == sorted((entry.id for entry in audit), reverse=True)
    assert {(entry.actor, entry.action) for entry in audit} == {("ops", "dead.purge")}
    page = backend.audit_list(limit=1, before_id=audit[0].id)
    assert page == audit[1:2]


def test_a_beat_in_a_transaction_rolls_back_whole(backend: Any) -> None:
    def failing() -> None:
        with backend.begin() as tx:
            tx.worker_beat(beat=beat(), minutes=[minute()], totals={("a", "completed"): 5})
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError, match="rolled back"):
        failing()
    assert backend.worker_list() == []
    assert backend.metric_totals() == {}


def test_the_async_faces_run_the_same_operations(backend: Any) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = [
            await backend.async_ops.worker_beat(
                beat=beat(), minutes=[minute()], totals={("a", "dead"): 1}
            )
        ]
        async with backend.begin_async() as tx:
            seen.append(await tx.metric_totals())
        seen.append([w.name for w in await backend.async_ops.worker_list()])
        if hasattr(backend, "close_async"):
            await backend.close_async()
        return seen

    assert asyncio.run(main()) == [START, {("a", "dead"): 1}, ["w1"]]


def test_clock_now_is_the_storage_clock(backend: Any, clock: ManualClock) -> None:
    """``clock_now``: the storage clock's now, the same through every path, and the
    backend's own ``now()``."""
    clock.advance(90)

    async def main() -> datetime:
        try:
            return await backend.async_ops.clock_now()  # type: ignore[no-any-return]
        finally:
            await backend.close_async()

    with backend.begin() as tx:
        in_tx = tx.clock_now()
    assert backend.clock_now() == in_tx == asyncio.run(main()) == START + timedelta(seconds=90)
    assert backend.now() == START + timedelta(seconds=90)
