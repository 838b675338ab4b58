"""Per-key order with workers SIGKILLed in a loop, judged by the checker from the
histories: per ordering key, completions follow publish order, and a key's next message
never starts while its previous one runs (at most one in flight per key) unless the
previous one's worker was killed.

``tests/runtime/test_ordering_kills.py`` covers the same guarantee from the handlers'
effects and the archive; this one runs it through the checker with producers that are
processes of their own.

Sizes (``SQLBROKER_FAULTS_SCALE`` = 1): 2 producers of 12 keys × 20 messages (100 ms
handlers, so that each key's chain lasts 2 s at least), published interleaved in batches
of 60 while 3 workers of 6 handlers (no prefetch), lease 2 s, consume them; a worker at
work SIGKILLed and replaced every 0.3–0.7 s, 10 times. The lease leaves a live worker 1.3 s
between two extensions: with a 1 s lease (0.7 s) a live worker lost three leases once in a
CI run on 2 loaded cores (the checker found them expired, not stolen), and this test forbids
any refused ack.
"""

from __future__ import annotations

import collections
import itertools
import random
import time
from pathlib import Path

import pytest

import sqlbroker
from reliability.history import Event
from reliability.processes import Fleet, scaled, wait_finished

QUEUE = "jobs"
KEYS, PER_KEY = 12, 20
WORKER = {
    "concurrency": 6,
    "prefetch": 0,
    "lease": 2.0,
    "reap_interval": 0.2,
    "poll_interval": 0.2,
    "max_attempts": 1000,
}


def runs_per_key(events: list[Event]) -> dict[str, list[tuple[float, float | None, str, int]]]:
    """Per key: each delivery's start, end (``None`` when its worker died first), message
    id and pid, in start order."""
    ends = {(e["id"], e["attempt"]): e["mono"] for e in events if e["op"] == "handled"}
    runs: dict[str, list[tuple[float, float | None, str, int]]] = collections.defaultdict(list)
    for event in events:
        if event["op"] == "deliver" and event["key"] is not None:
            end = ends.get((event["id"], event["attempt"]))
            runs[event["key"]].append((event["mono"], end, event["id"], event["pid"]))
    for trail in runs.values():
        trail.sort()
    return runs


@pytest.mark.slow
def test_keys_keep_their_order_with_workers_killed_in_a_loop(
    broker: sqlbroker.Broker, backend_url: str, tmp_path: Path
) -> None:
    per_producer = KEYS * scaled(PER_KEY)
    broker.backend.subscription_ensure(name=QUEUE)
    rng = random.Random(6)
    with Fleet(backend_url, tmp_path) as fleet:
        workers = [fleet.worker(**WORKER) for _ in range(3)]
        for name in ("producer-a", "producer-b"):
            fleet.producer(name, count=per_producer, batch=60, keys=KEYS, payload='{"sleep": 0.1}')
        kills = 0
        next_kill = time.monotonic() + 0.5

        def kill_some() -> None:
            nonlocal kills, next_kill
            if time.monotonic() < next_kill or kills >= scaled(10):
                return
            # Only a worker at work: killing one still starting tests nothing.
            ready = [n for n, worker in enumerate(workers) if worker.ready_path.exists()]
            if not ready:
                return
            next_kill = time.monotonic() + rng.uniform(0.3, 0.7)
            index = rng.choice(ready)
            fleet.inject(workers[index], "kill")
            workers[index] = fleet.worker(**WORKER)
            kills += 1

        wait_finished(backend_url, [QUEUE], 2 * per_producer, timeout=300, while_waiting=kill_some)
        statuses = fleet.stop_all()
        assert set(statuses.values()) == {0}, fleet.logs()
        events = fleet.events()

    verdict = fleet.verdict([QUEUE], events=events, lease=WORKER["lease"])
    print(f"{kills} kills;", verdict.summary())
    verdict.assert_clean()
    assert verdict.published == verdict.completed == 2 * per_producer
    assert kills >= 5
    assert verdict.duplicates["worker killed"] > 0
    # Nothing pauses a worker here: a live worker's lease (extended every third of it) is
    # never lost, so no ack may be refused. (One was, in a race of the key repair.)
    assert not [e for e in events if e["op"] == "settle_lost"]

    killed = {int(e["target"]) for e in events if e["op"] == "fault" and e["kind"] == "kill"}
    runs = runs_per_key(events)
    assert len(runs) == 2 * KEYS
    for key, trail in runs.items():
        for (_, end, message, pid), (start, _, following, _) in itertools.pairwise(trail):
            if message == following:
                continue
            if end is None:
                assert pid in killed, (key, message, following)
            else:
                assert end <= start, f"{key}: {following} started while {message} ran"
