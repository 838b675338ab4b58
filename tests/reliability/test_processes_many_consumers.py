"""Many consumer processes drain a large backlog while two producer processes publish it:
with no fault and leases that cannot expire, not a single message is delivered twice.

Sizes (``SQLBROKER_FAULTS_SCALE`` = 1): 100,000 messages from 2 producers in batches of
1,000 (``publish_many``, idempotency key = tag), drained by 4 worker processes of 8
handlers each (no-op coroutines, 120 more messages prefetched), lease 120 s (kept alive
while held).
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

import sqlbroker
from reliability.processes import Fleet, scaled, scaled_seconds, wait_finished

QUEUE = "jobs"


@pytest.mark.slow
def test_many_consumers_and_producers_make_no_duplicates(
    broker: sqlbroker.Broker, backend_url: str, tmp_path: Path
) -> None:
    # The checker holds every event in memory, four per message: 300,000 is the most a
    # soak (``make faults-long``) asks of it.
    total = scaled(100_000, minimum=2, maximum=300_000)
    producers, workers = 2, 4
    broker.backend.subscription_ensure(name=QUEUE)
    with Fleet(backend_url, tmp_path) as fleet:
        # A deep prefetch makes each claim and each batched ack carry more messages: the
        # four processes then spend their two cores on work rather than on round trips
        # and on waiting for SQLite's write lock.
        started = [
            fleet.worker(concurrency=8, prefetch=120, lease=120, grace=60) for _ in range(workers)
        ]
        for worker in started:
            worker.wait_ready()
        publishing = [
            fleet.producer(f"producer-{n}", count=total // producers, batch=1000)
            for n in range(producers)
        ]
        for producer in publishing:
            assert producer.wait(timeout=scaled_seconds(600)) == 0, producer.log()
        wait_finished(backend_url, [QUEUE], total, timeout=900)
        statuses = fleet.stop_all()
        assert set(statuses.values()) == {0}, fleet.logs()
        events = fleet.events()

    verdict = fleet.verdict([QUEUE], events=events)
    print(verdict.summary())
    verdict.assert_clean()
    assert verdict.published == verdict.completed == total
    assert not verdict.duplicates
    assert not verdict.recovered
    ops = collections.Counter(event["op"] for event in events)
    assert ops["deliver"] == ops["settled"] == total, ops
    assert ops["settle_lost"] == 0
    assert not [e for e in events if e["op"] == "publish" and e["status"] != "ok"]
    # Every worker took part: the work really was shared.
    per_worker = collections.Counter(e["pid"] for e in events if e["op"] == "deliver")
    assert len(per_worker) == workers, per_worker
