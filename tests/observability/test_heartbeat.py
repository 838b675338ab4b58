"""The worker records what it did: heartbeats, outcome counters and handler times, written
by its heartbeat and read back through ``broker.stats()`` and ``broker.workers()``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlbroker
from runtime.support import run_until_idle, wait_until
from sqlbroker.core.message import Delivery
from sqlbroker.core.observability import HANDLER_BUCKETS, bucket_index
from sqlbroker.core.settlements import Settlement
from sqlbroker.runtime.events import WorkerObserver
from sqlbroker.runtime.heartbeat import MetricsRecorder


class Recording(WorkerObserver):
    def __init__(self) -> None:
        self.finished: list[tuple[str, bool]] = []
        self.written: list[str] = []

    def handler_finished(
        self, delivery: Delivery, *, seconds: float, error: BaseException | None
    ) -> None:
        assert seconds >= 0
        self.finished.append((str(delivery.payload), error is not None))

    def outcomes_written(self, outcomes: Sequence[Settlement]) -> None:
        self.written.extend(o.kind for o in outcomes)


class Broken(WorkerObserver):
    def handler_finished(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("an observer bug")


def test_a_worker_run_is_counted_and_its_heartbeat_says_it_stopped(
    broker: sqlbroker.Broker,
) -> None:
    policy = sqlbroker.RetryPolicy(max_attempts=2, base=0.01, jitter="none")

    @broker.subscriber(queue="jobs", concurrency=2, retry=policy)
    def handle(msg: sqlbroker.Message) -> None:
        if msg.payload == "flaky" and msg.attempt == 1:
            raise ValueError("first try fails")
        if msg.payload == "doomed":
            raise ValueError("always fails")

    recording = Recording()
    broker.add_observer(recording)
    broker.add_observer(Broken())
    broker.send_many("jobs", ["ok1", "ok2", "ok3", "flaky", "doomed"])
    run_until_idle(broker)

    (jobs,) = broker.stats(window=600)
    # ok1..3 and flaky complete; flaky and doomed retry once each; doomed dies.
    # Counted over the window's 10 minutes plus the part of the minute its start falls in.
    assert 4 / 11 < jobs.completed_per_minute <= 4 / 10
    assert jobs.completed_per_minute == 2 * jobs.retried_per_minute == 4 * jobs.dead_per_minute
    assert jobs.handler_p50 is not None
    assert jobs.handler_p95 is not None
    assert jobs.handler_p50 <= jobs.handler_p95
    assert broker.backend.metric_totals() == {
        ("jobs", "completed"): 4,
        ("jobs", "retried"): 2,
        ("jobs", "dead"): 1,
    }
    (worker,) = broker.workers()
    assert worker.subscriptions == ("jobs",)
    assert worker.stopped_at is not None
    assert sorted(recording.written) == ["complete"] * 4 + ["dead"] + ["retry"] * 2
    assert sorted(recording.finished) == sorted(
        [(p, False) for p in ("ok1", "ok2", "ok3", "flaky")]
        + [("flaky", True), ("doomed", True), ("doomed", True)]
    )


def test_a_running_worker_is_alive_with_a_fresh_heartbeat(broker: sqlbroker.Broker) -> None:
    release = threading.Event()

    @broker.subscriber(queue="slow")
    def handle(msg: sqlbroker.Message) -> None:
        release.wait(10)

    broker.send("slow", "x")
    runner = threading.Thread(
        target=broker.run,
        kwargs={"install_signal_handlers": False, "heartbeat_interval": 0.2},
    )
    runner.start()
    try:
        first = wait_until(lambda: broker.workers(), timeout=10, what="a heartbeat")[0]
        assert first.stopped_at is None
        later = wait_until(
            lambda: [w for w in broker.workers() if w.seen_at > first.seen_at],
            timeout=10,
            what="a second heartbeat",
        )[0]
        assert later.started_at == first.started_at
        assert later.seen_age < 60
    finally:
        release.set()
        broker.stop()
        runner.join(20)
    assert not runner.is_alive()
    assert broker.workers()[0].stopped_at is not None


def test_handler_times_fill_the_histogram_bucket_of_their_bound() -> None:
    """The recorder's shortcut for the first bucket agrees with ``bucket_index``, also on
    the bounds themselves (a bound belongs to its own bucket)."""
    recorder = MetricsRecorder("w", wall=lambda: 120.0)
    times = [0.0, 1e-6, *HANDLER_BUCKETS[:-1], *(b * 1.001 for b in HANDLER_BUCKETS[:-1])]
    at = datetime(2026, 1, 1, tzinfo=UTC)
    delivery = Delivery(
        id=1,
        message_id="m",
        subscription="jobs",
        topic="jobs",
        payload=None,
        content_type="application/json",
        headers={},
        priority=5,
        key=None,
        idempotency_key=None,
        attempt=1,
        max_attempts=5,
        replay_count=0,
        enqueued_at=at,
        available_at=at,
        expires_at=None,
        lease_token="t",
        lease_expires_at=at,
    )
    for seconds in times:
        recorder.handler_finished(delivery, seconds=seconds, error=None)
    (row,), _ = recorder.take()
    expected = [0] * len(HANDLER_BUCKETS)
    for seconds in times:
        expected[bucket_index(seconds)] += 1
    assert row.handler_buckets == expected
    assert row.handler_buckets[0] == 3  # 0, 1 us, and the first bound itself
