"""Poison messages mixed into healthy traffic: handlers that ``os._exit`` their worker, that
raise, or that hang past their timeout. Each poison is dead-lettered after exactly its
``max_attempts`` attempts (the dead row's count and the deliveries in the histories), and
the healthy messages finish within twice the time the same healthy load takes without
poison, measured first in the same test.

``sqlbroker worker`` does not respawn a worker that died (it is one process, meant to run
under a process supervisor), so this test does the supervisor's job: a worker gone is
replaced at once.

Sizes (``SQLBROKER_FAULTS_SCALE`` = 1): 5,000 healthy messages of 10 ms and 1 poison
message of each kind (``max_attempts`` 3; the healthy ones 20, because a worker's death
charges an attempt to every message it held), 3 workers of 4 handlers, lease 1 s, handler
timeout 0.5 s.
"""

from __future__ import annotations

import collections
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from reliability.history import Event, HistoryWriter
from reliability.processes import Fleet, scaled, sqlite_path, wait_finished
from runtime.support import ModuleProcess

POISON_ATTEMPTS = 3
HEALTHY_ATTEMPTS = 20
POISONS: dict[str, dict[str, Any]] = {
    "exit": {"exit": 1000},
    "raise": {"raise": 1000},
    "hang": {"hang": 1000},
}
WORKER = {
    "concurrency": 4,
    "lease": 1.0,
    "reap_interval": 0.2,
    "poll_interval": 0.2,
    "handler_timeout": 0.5,
    "retry_base": 0.05,
}


def publish(
    broker: sqlbroker.Broker, writer: HistoryWriter, queue: str, messages: list[dict[str, Any]]
) -> None:
    """Publish from the test itself, in batches of 5,000, recorded in its history."""
    for start in range(0, len(messages), 5000):
        batch = messages[start : start + 5000]
        items = [
            {
                "topic": queue,
                "payload": payload,
                "idempotency_key": payload["tag"],
                "max_attempts": POISON_ATTEMPTS if "poison" in payload else HEALTHY_ATTEMPTS,
            }
            for payload in batch
        ]
        for payload, message_id in zip(batch, broker.publish_many(items), strict=True):
            writer.published(payload["tag"], message_id, ikey=payload["tag"], subs=[queue])


class Supervisor:
    """Keeps ``count`` workers on ``queue`` running, replacing any that died."""

    def __init__(self, fleet: Fleet, queue: str, count: int) -> None:
        self.fleet = fleet
        self.queue = queue
        self.workers = [self._start() for _ in range(count)]
        self.replaced = 0

    def _start(self) -> ModuleProcess:
        return self.fleet.worker(queues=self.queue, **WORKER)

    def wait_ready(self) -> None:
        for worker in self.workers:
            worker.wait_ready()

    def step(self) -> None:
        for index, worker in enumerate(self.workers):
            if not worker.alive:
                self.workers[index] = self._start()
                self.replaced += 1


def healthy_seconds(events: list[Event], queue: str) -> float:
    """From the first publish to the last completion of a healthy message of ``queue``."""
    published = [e["mono"] for e in events if e["op"] == "publish" and e["subs"] == [queue]]
    healthy = {
        e["tag"]
        for e in events
        if e["op"] == "deliver" and e["sub"] == queue and not e["tag"].startswith("poison")
    }
    attempts_by_tag = {(e["id"], e["attempt"]): e["tag"] for e in events if e["op"] == "deliver"}
    done = [
        e["mono"]
        for e in events
        if e["op"] == "settled"
        and e["kind"] == "complete"
        and e["sub"] == queue
        and attempts_by_tag.get((e["id"], e["attempt"])) in healthy
    ]
    return max(done) - min(published)


def dead_rows(url: str, queue: str) -> dict[str, int]:
    """Tag → attempts of the dead letters of ``queue``, read with plain SQL."""
    sql = "SELECT payload, attempts FROM sqlbroker_dead WHERE subscription = "
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(url))
        try:
            rows = conn.execute(sql + "?", (queue,)).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as pg:
            rows = pg.execute(sql + "%s", (queue,)).fetchall()
    return {json.loads(bytes(payload))["tag"]: attempts for payload, attempts in rows}


def run_phase(
    fleet: Fleet,
    broker: sqlbroker.Broker,
    writer: HistoryWriter,
    queue: str,
    messages: list[dict[str, Any]],
) -> int:
    """Start the workers, publish, keep them alive until every message ended; return how
    many workers were replaced."""
    broker.backend.subscription_ensure(name=queue)
    supervisor = Supervisor(fleet, queue, count=3)
    supervisor.wait_ready()
    publish(broker, writer, queue, messages)
    wait_finished(fleet.url, [queue], len(messages), timeout=300, while_waiting=supervisor.step)
    statuses = fleet.stop_all()
    assert set(statuses.values()) == {0}, fleet.logs()
    return supervisor.replaced


@pytest.mark.slow
def test_poison_is_quarantined_after_max_attempts_and_healthy_work_goes_on(
    broker: sqlbroker.Broker, backend_url: str, tmp_path: Path
) -> None:
    healthy = scaled(5000)
    per_kind = scaled(1)
    writer = HistoryWriter(tmp_path, "producer")
    with Fleet(backend_url, tmp_path) as fleet:
        baseline = [{"tag": f"clean-{n}", "sleep": 0.01} for n in range(healthy)]
        run_phase(fleet, broker, writer, "baseline", baseline)
        mixed = [{"tag": f"healthy-{n}", "sleep": 0.01} for n in range(healthy)]
        rng = random.Random(4)
        for kind, behaviour in POISONS.items():
            for n in range(per_kind):
                poison = {"tag": f"poison-{kind}-{n}", "poison": kind, **behaviour}
                # In the first third of the backlog, so that each poison's three rounds
                # (each a lease and a reaper pass long) fall while healthy work goes on.
                mixed.insert(rng.randrange(len(mixed) // 3), poison)
        replaced = run_phase(fleet, broker, writer, "jobs", mixed)
        events = fleet.events()
    writer.close()

    verdict = fleet.verdict(["jobs"], events=events, lease=WORKER["lease"])
    clean, poisoned = healthy_seconds(events, "baseline"), healthy_seconds(events, "jobs")
    print(
        f"healthy: {clean:.2f} s clean, {poisoned:.2f} s with poison; {replaced} workers"
        f" replaced; {verdict.summary()}"
    )
    verdict.assert_clean()
    assert verdict.published == 2 * healthy + 3 * per_kind
    assert verdict.completed == 2 * healthy
    exits = sum(1 for e in events if e["op"] == "fault" and e["kind"] == "exit")
    assert replaced == exits

    dead = dead_rows(backend_url, "jobs")
    poison_tags = {m["tag"] for m in mixed if "poison" in m}
    assert set(dead) == poison_tags
    assert set(dead.values()) == {POISON_ATTEMPTS}, dead
    deliveries = collections.Counter(
        e["tag"] for e in events if e["op"] == "deliver" and e["tag"] in poison_tags
    )
    for tag in poison_tags:
        if tag.startswith("poison-exit") and per_kind > 1:
            # Two such poisons held by one worker: the first ends the process before the
            # other's handler starts, yet the other's attempt was counted at its claim.
            assert 1 <= deliveries[tag] <= POISON_ATTEMPTS, (tag, deliveries[tag])
        else:
            assert deliveries[tag] == POISON_ATTEMPTS, (tag, deliveries[tag])
    if per_kind == 1:
        assert exits == POISON_ATTEMPTS
    assert verdict.duplicates["worker exited"] > 0
    assert verdict.duplicates["handler failed"] + verdict.duplicates["explicit retry"] > 0
    # A ratio against the same run's baseline, not a time limit (the bound).
    assert poisoned <= 2 * clean, (poisoned, clean)
