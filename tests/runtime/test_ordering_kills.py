"""Per-key ordering across worker processes SIGKILLed in a loop (DESIGN §2.5): messages of
one key complete in publish order, at most one in flight per key, whatever dies when."""

from __future__ import annotations

import collections
import itertools
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import sqlbroker
from runtime.support import WorkerProcess, assert_all_completed_once, events

Spawn = Callable[..., WorkerProcess]


@pytest.mark.slow
def test_keys_keep_their_order_with_workers_killed_in_a_loop(
    broker: sqlbroker.Broker, spawn_worker: Spawn, effects: Path
) -> None:
    keys, per_key = 12, 15
    ids: dict[str, str] = {}
    # Interleaved publishes: each key's messages are spread over the whole backlog.
    for seq in range(per_key):
        for key in range(keys):
            name = f"k{key:02d}-{seq:02d}"
            ids[broker.send("jobs", {"id": name, "sleep": 0.02}, key=f"k{key:02d}")] = name
    options = {
        "lease": 1.0,
        "reap_interval": 0.2,
        "concurrency": 6,
        "prefetch": 0,
        "max_attempts": 100,
    }
    rng = random.Random(11)
    workers = [spawn_worker(**options) for _ in range(3)]
    kills = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and kills < 10:
        time.sleep(rng.uniform(0.3, 0.7))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.send(signal.SIGKILL)
        victim.wait(timeout=10)
        kills += 1
        workers.append(spawn_worker(**options))
    for worker in workers:
        worker.send(signal.SIGTERM)
        worker.wait(timeout=30)
    final = spawn_worker(**options, mode="until-idle")
    assert final.wait(timeout=90) == 0, final.log()

    archived = assert_all_completed_once(broker, "jobs", ids)
    # Completion order (the archive's insertion order) per key is publish order.
    by_key: dict[str, list[str]] = collections.defaultdict(list)
    for message_id, row in sorted(archived.items(), key=lambda item: item[1].id):
        by_key[row.key or ""].append(ids[message_id])
    assert all(names == sorted(names) for names in by_key.values()), by_key
    assert sum(len(names) for names in by_key.values()) == keys * per_key

    # Handler starts per key never go back: once a message of a key has started, no
    # earlier message of that key starts again (a redelivery of the same one may).
    starts: dict[str, list[str]] = collections.defaultdict(list)
    for event in sorted(events(effects, "start"), key=lambda e: e["time"]):
        starts[event["id"][:3]].append(event["id"])
    for key, names in starts.items():
        assert all(a <= b for a, b in itertools.pairwise(names)), (key, names)
    assert kills >= 5
