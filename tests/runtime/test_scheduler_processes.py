"""Real scheduler processes (``sqlbroker scheduler``) racing over one database, on both
backends: however many run, and however often they are SIGKILLed mid-pass, every tick of
a schedule is published exactly once, and with ``missed="all"`` none is lost."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import sqlbroker

pytestmark = pytest.mark.slow

EVERY = 0.1
CRON_EVERY_SECOND = "* * * * * *"


class SchedulerProcess:
    def __init__(self, url: str, log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from sqlbroker.interfaces.cli import main; main()",
                    "scheduler",
                    "--poll-interval",
                    "0.05",
                    "--log-level",
                    "info",
                ],
                env={**os.environ, "SQLBROKER_URL": url},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    def wait_running(self) -> None:
        """Until the process has its signal handlers (it logs that it is running)."""
        deadline = time.monotonic() + 60
        while "scheduler running" not in self.log_path.read_text(errors="replace"):
            assert self.process.poll() is None, self.log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.05)

    def terminate(self) -> int:
        self.wait_running()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


Spawn = Callable[[], SchedulerProcess]


@pytest.fixture
def spawn(backend_url: str, tmp_path: Path) -> Iterator[Spawn]:
    started: list[SchedulerProcess] = []

    def start() -> SchedulerProcess:
        process = SchedulerProcess(backend_url, tmp_path / f"scheduler{len(started)}.log")
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def tick_counts(broker: sqlbroker.Broker) -> dict[str, Counter[datetime]]:
    """Tick messages delivered to ``seen``, counted per schedule and tick."""
    counts: dict[str, Counter[datetime]] = {}
    while batch := broker.claim("seen", limit=1000):
        for delivery in batch:
            name = delivery.headers["sqlbroker-schedule"]
            tick = datetime.fromisoformat(delivery.headers["sqlbroker-tick"])
            counts.setdefault(name, Counter())[tick] += 1
        broker.complete(batch)
    return counts


def define(broker: sqlbroker.Broker) -> dict[str, datetime]:
    broker.subscribe("seen", ["#"])
    fast = broker.schedule("fast", "ticks.fast", {"n": 1}, every=EVERY, missed="all")
    cron = broker.schedule("second", "ticks.second", {}, cron=CRON_EVERY_SECOND, missed="all")
    return {"fast": fast.next_run_at, "second": cron.next_run_at}


def assert_each_tick_once(broker: sqlbroker.Broker, first: dict[str, datetime]) -> int:
    """Every tick from the first to the last published is there, exactly once."""
    broker.run_due_schedules()  # catch up to now, so the expected range has no gap
    counts = tick_counts(broker)
    total = 0
    for name, step in (("fast", timedelta(seconds=EVERY)), ("second", timedelta(seconds=1))):
        found = counts.get(name, Counter())
        duplicated = {tick: n for tick, n in found.items() if n > 1}
        assert not duplicated, f"{name}: ticks published more than once: {duplicated}"
        last = max(found)
        expected = []
        tick = first[name]
        while tick <= last:
            expected.append(tick)
            tick += step
        assert sorted(found) == expected, f"{name}: missing {sorted(set(expected) - set(found))}"
        total += len(expected)
    return total


def test_racing_scheduler_processes_publish_each_tick_once(
    broker: sqlbroker.Broker, spawn: Spawn
) -> None:
    first = define(broker)
    processes = [spawn() for _ in range(4)]
    time.sleep(5.0)
    for process in processes:
        assert process.terminate() == 0, process.log_path.read_text()
    total = assert_each_tick_once(broker, first)
    assert total > 20  # ~50 fast ticks and ~5 cron ticks in 5 s, but load varies


def test_scheduler_processes_killed_in_a_loop_still_publish_each_tick_once(
    broker: sqlbroker.Broker, spawn: Spawn
) -> None:
    first = define(broker)
    chooser = random.Random(4)
    processes = [spawn() for _ in range(3)]
    for _ in range(20):
        time.sleep(chooser.uniform(0.1, 0.5))
        victim = processes.pop(chooser.randrange(len(processes)))
        victim.process.send_signal(signal.SIGKILL)
        victim.kill()
        processes.append(spawn())
    for process in processes:
        assert process.terminate() == 0, process.log_path.read_text()
    total = assert_each_tick_once(broker, first)
    assert total > 20
