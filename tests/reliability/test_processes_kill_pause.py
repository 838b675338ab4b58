"""Workers SIGKILLed and respawned in a loop while others are paused (SIGSTOP) for longer
than their lease: nothing is lost, a resumed worker's acks are refused (``LeaseLost``,
recorded as ``settle_lost``), and each message whose ack was refused completes exactly once,
by the consumer that took it over.

Sizes (``SQLBROKER_FAULTS_SCALE`` = 1): 1,500 messages of 50 ms handlers, 3 workers of 4
handlers, lease 1 s, reaper every 0.2 s; a fault every 0.4–0.8 s while the backlog lasts:
a pause of 2.5 leases first, then kills, and a pause again after each pause ended and two
kills followed.
"""

from __future__ import annotations

import collections
import random
import time
from pathlib import Path

import pytest

import sqlbroker
from reliability.history import Event
from reliability.processes import Fleet, scaled, scaled_seconds, wait_finished
from runtime.support import ModuleProcess

QUEUE = "jobs"
LEASE = 1.0
# Long enough that the lease surely expired, was reaped (every 0.2 s) and was claimed by a
# running worker (which polls at most every 0.2 s) before the paused one resumes.
PAUSE = 2.5 * LEASE
WORKER = {
    "concurrency": 4,
    "lease": LEASE,
    "reap_interval": 0.2,
    "poll_interval": 0.2,
    "max_attempts": 1000,
    "grace": 30,
}


class FaultLoop:
    """One fault per step against a random worker at work: a pause first, then kills (each
    killed worker replaced at once), and another pause once the last one ended and two
    kills followed it. At most one worker is paused at a time; the others keep running."""

    def __init__(self, fleet: Fleet, workers: int, seed: int) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.workers = [fleet.worker(**WORKER) for _ in range(workers)]
        self.paused: tuple[ModuleProcess, float] | None = None
        self.next_step = time.monotonic() + 1.0
        self.counts: collections.Counter[str] = collections.Counter()
        self.kills_since_pause = 2  # the first fault is a pause

    def step(self) -> None:
        now = time.monotonic()
        if self.paused is not None and now >= self.paused[1]:
            self.fleet.inject(self.paused[0], "cont")
            self.paused = None
        if now < self.next_step:
            return
        # Only workers at work: a fault while one still starts tests little.
        running = [
            worker
            for worker in self.workers
            if worker.ready_path.exists() and (self.paused is None or worker is not self.paused[0])
        ]
        if not running:
            return
        self.next_step = now + self.rng.uniform(0.4, 0.8)
        victim = self.rng.choice(running)
        if self.paused is None and self.kills_since_pause >= 2:
            self.fleet.inject(victim, "stop")
            self.paused = (victim, now + PAUSE)
            self.counts["stop"] += 1
            self.kills_since_pause = 0
        else:
            self.fleet.inject(victim, "kill")
            self.workers[self.workers.index(victim)] = self.fleet.worker(**WORKER)
            self.counts["kill"] += 1
            self.kills_since_pause += 1

    def finish(self) -> None:
        if self.paused is not None:
            self.fleet.inject(self.paused[0], "cont")
            self.paused = None


def refused_acks(events: list[Event]) -> list[Event]:
    return [event for event in events if event["op"] == "settle_lost"]


@pytest.mark.slow
def test_kills_and_pauses_lose_nothing_and_refuse_stale_acks(
    broker: sqlbroker.Broker, backend_url: str, tmp_path: Path
) -> None:
    total = scaled(1500)
    broker.backend.subscription_ensure(name=QUEUE)
    with Fleet(backend_url, tmp_path) as fleet:
        producer = fleet.producer("producer", count=total, batch=500, payload='{"sleep": 0.05}')
        assert producer.wait(timeout=scaled_seconds(120)) == 0, producer.log()
        faults = FaultLoop(fleet, workers=3, seed=20)
        wait_finished(backend_url, [QUEUE], total, timeout=300, while_waiting=faults.step)
        faults.finish()
        statuses = fleet.stop_all()
        assert set(statuses.values()) == {0}, fleet.logs()
        events = fleet.events()

    verdict = fleet.verdict([QUEUE], events=events, lease=LEASE)
    print(dict(faults.counts), f"{len(refused_acks(events))} refused acks;", verdict.summary())
    verdict.assert_clean()
    assert verdict.published == verdict.completed == total
    assert faults.counts["kill"] >= 5
    assert faults.counts["stop"] >= 2
    assert verdict.duplicates["worker killed"] > 0
    assert verdict.duplicates["worker paused"] > 0

    refused = refused_acks(events)
    paused = {e["target"] for e in events if e["op"] == "fault" and e["kind"] == "stop"}
    assert refused, "no pause produced a refused ack"
    assert {e["pid"] for e in refused} <= paused
    completions: dict[str, list[Event]] = collections.defaultdict(list)
    for event in events:
        if event["op"] == "settled" and event["kind"] == "complete":
            completions[event["id"]].append(event)
    for event in refused:
        # The database says how the message ended. Its completion may be missing from the
        # histories: a worker killed between the commit and the history line logs nothing.
        (archived,) = broker.archive(QUEUE, message_id=event["id"], outcome="completed")
        assert archived.attempts > event["attempt"]
        logged = completions[event["id"]]
        assert len(logged) <= 1
        assert all(completion["attempt"] > event["attempt"] for completion in logged)
