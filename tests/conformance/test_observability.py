"""Observability storage: heartbeats, per-minute counters, totals, rare outcomes, audit."""

from __future__ import annotations

from datetime import timedelta

import pytest

import sqlbroker
from helpers import claim_one, now_of, stats_of
from sqlbroker.core.observability import HANDLER_BUCKETS, MinuteCounts, WorkerBeat


def _beat(name: str = "host:1", **options: object) -> WorkerBeat:
    return WorkerBeat(name=name, host="host", pid=1, subscriptions=("q",), **options)  # type: ignore[arg-type]


def test_heartbeat_records_the_worker_and_its_age(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    backend = clocked_broker.backend
    started = now_of(clock)
    assert backend.worker_beat(beat=_beat(starting=True), minutes=[], totals={}) == started
    clock.advance(7)
    backend.worker_beat(beat=_beat(), minutes=[], totals={})
    clock.advance(3)
    (worker,) = clocked_broker.workers()
    assert (worker.name, worker.host, worker.pid, worker.subscriptions) == (
        "host:1",
        "host",
        1,
        ("q",),
    )
    assert worker.started_at == pytest.approx(started, abs=timedelta(milliseconds=1))
    assert worker.seen_age == pytest.approx(3, abs=0.01)
    assert worker.stopped_at is None
    backend.worker_beat(beat=_beat(stopping=True), minutes=[], totals={})
    (stopped,) = clocked_broker.workers()
    assert stopped.stopped_at is not None
    backend.worker_beat(beat=_beat(starting=True), minutes=[], totals={})
    (restarted,) = clocked_broker.workers()
    assert restarted.stopped_at is None
    assert restarted.started_at > worker.started_at


def test_minute_rows_are_absolute_and_totals_add_up(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    backend = clocked_broker.backend
    clocked_broker.subscribe("q", "q")
    _advance_to_second(clock, 30)
    minute = now_of(clock).replace(second=0, microsecond=0)
    row = MinuteCounts(subscription="q", minute=minute, worker="w1", completed=3, retried=1)
    row.handler_count = 4
    row.handler_seconds = 0.4
    row.handler_buckets[6] = 4  # 0.05 < t <= 0.1
    backend.worker_beat(beat=_beat("w1"), minutes=[row], totals={("q", "completed"): 3})
    row.completed = 5
    other = MinuteCounts(subscription="q", minute=minute, worker="w2", dead=2)
    backend.worker_beat(
        beat=_beat("w1"), minutes=[row], totals={("q", "completed"): 2, ("q", "retried"): 1}
    )
    backend.worker_beat(beat=_beat("w2"), minutes=[other], totals={("q", "dead"): 2})
    rows = backend.metric_minutes(since=minute)
    assert sorted((r.worker, r.completed, r.retried, r.dead) for r in rows) == [
        ("w1", 5, 1, 0),
        ("w2", 0, 0, 2),
    ]
    assert len(rows[0].handler_buckets) == len(HANDLER_BUCKETS)
    assert backend.metric_totals() == {("q", "completed"): 5, ("q", "retried"): 1, ("q", "dead"): 2}
    assert backend.metric_minutes(since=minute + timedelta(minutes=1)) == []
    clock.advance(30)  # the window is exactly that minute
    q = clocked_broker.stats(window=60)[0]
    assert (q.completed_per_minute, q.retried_per_minute, q.dead_per_minute) == (5, 1, 2)
    assert q.handler_p50 is not None
    assert 0.05 <= q.handler_p50 <= q.handler_p95 <= 0.1  # type: ignore[operator]
    series = clocked_broker.metrics_series(minutes=3)["q"]
    assert len(series) == 3
    assert [p.completed for p in series if p.minute == minute] == [5]
    assert sum(p.completed for p in series) == 5


def _advance_to_second(clock: sqlbroker.ManualClock, second: int) -> None:
    """Move the clock forward to the next time whose seconds are ``second`` (and no
    microseconds), so that a window's edges fall at known places in the minutes."""
    now = now_of(clock)
    target = now.replace(second=second, microsecond=0)
    if target <= now:
        target += timedelta(minutes=1)
    clock.advance(target - now)


@pytest.mark.parametrize("second", [0, 30, 59])
def test_rates_divide_by_the_minutes_they_count(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, second: int
) -> None:
    """A window of 5 minutes overlaps up to 6 minute rows, the last one partial: a steady
    60 completions a minute reads as 60 a minute wherever the window falls."""
    backend = clocked_broker.backend
    clocked_broker.subscribe("q", "q")
    _advance_to_second(clock, second)
    now = now_of(clock)
    current = now.replace(second=0)
    rows = [
        MinuteCounts(subscription="q", minute=current - timedelta(minutes=back), worker="w")
        for back in range(7)
    ]
    for row in rows:
        row.completed = 60
    rows[0].completed = second  # the current minute so far
    backend.worker_beat(beat=_beat("w"), minutes=rows, totals={})
    (q,) = clocked_broker.stats()
    assert q.completed_per_minute == pytest.approx(60)


def test_trim_removes_old_minutes_and_silent_workers(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    backend = clocked_broker.backend
    minute = now_of(clock).replace(second=0, microsecond=0)
    backend.worker_beat(
        beat=_beat("old"),
        minutes=[MinuteCounts(subscription="q", minute=minute, worker="old", completed=1)],
        totals={},
    )
    clock.advance(3600)
    backend.worker_beat(beat=_beat("new"), minutes=[], totals={})
    assert backend.metric_trim(older_than=now_of(clock) - timedelta(minutes=30), limit=100) == 2
    assert [w.name for w in clocked_broker.workers()] == ["new"]
    assert backend.metric_minutes(since=minute - timedelta(days=1)) == []


def test_expired_and_unrouted_are_counted_from_the_archive(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.subscribe("orders", "orders.*")
    clocked_broker.publish("nobody.listens", 1)
    clocked_broker.publish("nobody.listens", 2)
    clocked_broker.publish("orders.new", 3, ttl=5)
    clocked_broker.publish("orders.new", 4)
    clock.advance(10)
    assert clocked_broker.reap()["expired"] == 1
    assert stats_of(clocked_broker, "orders").expired == 1
    clock.advance(120)
    unrouted = clocked_broker.unrouted(window=60)
    assert (unrouted.total, unrouted.recent) == (2, 0)
    assert clocked_broker.unrouted(window=3600).recent == 2


def test_audit_lists_replays_and_purges_newest_first(broker: sqlbroker.Broker) -> None:
    broker.send_many("q", [1, 2, 3])
    for _ in range(3):
        broker.dead_letter(claim_one(broker, "q"), reason="bad")
    first, second, third = (d.id for d in broker.dead_letters.list())
    broker.dead_letters.replay([first], actor="alice", note="fixed")
    broker.dead_letters.purge([second, third], actor="bob", note="junk")
    purge, replay = broker.audit()
    assert (purge.actor, purge.action, purge.detail["dead_ids"]) == (
        "bob",
        "dead.purge",
        [
            second,
            third,
        ],
    )
    assert (replay.actor, replay.action, replay.detail["note"]) == ("alice", "dead.replay", "fixed")
    assert purge.at >= replay.at
    assert broker.audit(before_id=purge.id) == [replay]
    assert broker.audit(limit=1) == [purge]
    with pytest.raises(sqlbroker.InvalidOption):
        broker.audit(limit=0)
