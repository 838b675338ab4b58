"""Concurrency caps under a kill loop: worker processes SIGKILLed and replaced while they
drain a capped queue (``max_running``) and a keyed one (``key_concurrency``). From the
histories (each handler's start and end, a killed worker's handlers ending at its kill)
the number of handlers running at once never passes the cap, in all and per key, and
nothing is lost.

Sizes (``SQLBROKER_FAULTS_SCALE`` = 1): 200 messages of 150 ms capped at 3 running, 200 of
50 ms on 4 keys capped at 2 per key, 3 workers of 4 handlers each (12 slots, 4 times the
cap), lease 1 s, reaper every 0.2 s; a worker killed every 0.8-1.6 s while the backlog
lasts, each replaced at once. The cap itself makes the capped backlog last at least
200 × 0.15 s / 3 = 10 s however fast the machine is, so the loop's kills (at least five)
do not depend on the machine being slow.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
from pathlib import Path

import pytest

import sqlbroker
from reliability.history import Event
from reliability.processes import Fleet, scaled, scaled_seconds, wait_finished
from runtime.support import ModuleProcess

CAPPED, KEYED = "capped", "keyed"
MAX_RUNNING, KEY_CONCURRENCY, KEYS = 3, 2, 4
WORKER = {
    "queues": f"{CAPPED},{KEYED}",
    "concurrency": 4,
    "lease": 1.0,
    "reap_interval": 0.2,
    "poll_interval": 0.1,
    "max_attempts": 1000,
    "grace": 30,
}


class KillLoop:
    """A random worker at work SIGKILLed every 0.8-1.6 s, replaced at once."""

    def __init__(self, fleet: Fleet, workers: int, seed: int) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.workers: list[ModuleProcess] = [fleet.worker(**WORKER) for _ in range(workers)]
        self.next_step = time.monotonic() + 1.0
        self.kills = 0

    def step(self) -> None:
        now = time.monotonic()
        running = [worker for worker in self.workers if worker.ready_path.exists()]
        if now < self.next_step or not running:
            return
        self.next_step = now + self.rng.uniform(0.8, 1.6)
        victim = self.rng.choice(running)
        self.fleet.inject(victim, "kill")
        self.workers[self.workers.index(victim)] = self.fleet.worker(**WORKER)
        self.kills += 1


def most_at_once(events: list[Event], group: str) -> collections.Counter[str]:
    """The most handlers running at once per ``group`` (``sub``, or ``sub`` and ``key``):
    a handler runs from its ``deliver`` to its ``handled``, or to the kill of its process
    (recorded before the signal was sent, so never later than the handler's real end)."""
    killed_at = {
        e["target"]: e["mono"] for e in events if e["op"] == "fault" and e["kind"] == "kill"
    }
    changes: list[tuple[float, int, str]] = []
    open_handlers: dict[tuple[int, int, str], str] = {}
    for event in events:
        if event["op"] not in ("deliver", "handled"):
            continue
        handler = (event["pid"], event["delivery"], event["token"])
        if event["op"] == "deliver":
            name = event["sub"] if group == "sub" else f"{event['sub']}/{event['key']}"
            open_handlers[handler] = name
            changes.append((event["mono"], 1, name))
        elif handler in open_handlers:
            changes.append((event["mono"], -1, open_handlers.pop(handler)))
    for (pid, _, _), name in open_handlers.items():
        assert pid in killed_at, f"a handler of {pid} never ended and it was not killed"
        changes.append((killed_at[pid], -1, name))
    # At one instant an end comes before a start: the slot was free by then.
    changes.sort(key=lambda change: (change[0], change[1]))
    running: collections.Counter[str] = collections.Counter()
    most: collections.Counter[str] = collections.Counter()
    for _, step, name in changes:
        running[name] += step
        most[name] = max(most[name], running[name])
    return most


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_caps_hold_across_processes_under_a_kill_loop(
    broker: sqlbroker.Broker, backend_url: str, tmp_path: Path
) -> None:
    total = scaled(200)
    for queue in (CAPPED, KEYED):
        broker.backend.subscription_ensure(name=queue)
    broker.set_flow(CAPPED, max_running=MAX_RUNNING)
    broker.set_flow(KEYED, key_concurrency=KEY_CONCURRENCY)
    with Fleet(backend_url, tmp_path) as fleet:
        for queue, keys, sleep in ((CAPPED, None, 0.15), (KEYED, KEYS, 0.05)):
            producer = fleet.producer(
                queue,
                queue=queue,
                count=total,
                batch=100,
                payload=f'{{"sleep": {sleep}}}',
                **({} if keys is None else {"keys": keys}),
            )
            assert producer.wait(timeout=scaled_seconds(120)) == 0, producer.log()
        kills = KillLoop(fleet, workers=3, seed=26)
        wait_finished(
            backend_url, [CAPPED, KEYED], 2 * total, timeout=300, while_waiting=kills.step
        )
        statuses = fleet.stop_all()
        assert set(statuses.values()) == {0}, fleet.logs()
        events = fleet.events()

    verdict = fleet.verdict([CAPPED, KEYED], events=events, lease=1.0)
    by_subscription = most_at_once(events, "sub")
    by_key = most_at_once(events, "key")
    print(
        f"{kills.kills} kills; at once: {dict(by_subscription)} {dict(by_key)};", verdict.summary()
    )
    # key_concurrency > 1 gives up strict order within a key (docs/flow-control.md).
    dataclasses.replace(verdict, order=[]).assert_clean()
    assert verdict.published == verdict.completed == 2 * total
    assert kills.kills >= 5
    assert verdict.duplicates["worker killed"] > 0
    assert by_subscription[CAPPED] == MAX_RUNNING  # reached, never passed
    keyed = {name: most for name, most in by_key.items() if name.startswith(f"{KEYED}/")}
    assert len(keyed) == KEYS
    assert max(keyed.values()) == KEY_CONCURRENCY
