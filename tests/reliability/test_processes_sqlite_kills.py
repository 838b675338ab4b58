"""SQLite with several producer and consumer processes SIGKILLed in a loop (SQLite only:
many processes on one file is its own risk). Afterwards the file passes ``PRAGMA
integrity_check``, no caller saw "database is locked" or any error that is not
sqlbroker's (histories and worker logs), the WAL stayed bounded, and the checker is clean.

Sizes (``SQLBROKER_FAULTS_SCALE`` = 1): 3 producers of 1,000 messages each (batches of 20,
0.1 s apart, so that publishing lasts while the kills go on) and 3 workers of 4 handlers
(30 ms each), lease 1 s; one process killed every 0.3–0.6 s, producers and workers in
turn, until the producers are done and at least 20 kills happened; each killed process is
replaced at once (a producer by one that resumes its predecessor's work).
"""

from __future__ import annotations

import collections
import random
import re
import sqlite3
import time
from pathlib import Path

import pytest

import sqlbroker
from reliability.processes import (
    Fleet,
    SizeSampler,
    scaled,
    scaled_seconds,
    sqlite_path,
    wait_finished,
)
from runtime.support import ModuleProcess

QUEUE = "jobs"
PRODUCERS = 3
WORKER = {
    "concurrency": 4,
    "lease": 1.0,
    "reap_interval": 0.2,
    "poll_interval": 0.2,
    "max_attempts": 1000,
}
# sqlbroker leaves SQLite's wal_autocheckpoint at its default of 1000 pages (4 MiB with
# 4 KiB pages): the next write after the WAL passes it checkpoints, and once a checkpoint
# completed the WAL is written again from its start, so the file stays near that size. It
# grows past it only while readers keep a checkpoint from completing. Four times that is
# room for writers caught mid-checkpoint, and far below what an unbounded WAL reaches.
WAL_BOUND = 4 * 1000 * 4096
PROBLEMS = re.compile(r"database is locked|Traceback|DatabaseBusy|StorageError|OperationalError")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/test.db"
    with sqlbroker.Broker(url) as broker:
        broker.backend.subscription_ensure(name=QUEUE)
    return url


class KillLoop:
    def __init__(self, fleet: Fleet, per_producer: int, seed: int) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.per_producer = per_producer
        self.producers = {f"producer-{n}": self._producer(f"producer-{n}") for n in range(3)}
        self.workers = [fleet.worker(**WORKER) for _ in range(3)]
        self.kills: collections.Counter[str] = collections.Counter()
        self.next_step = time.monotonic() + 0.5

    def _producer(self, name: str) -> ModuleProcess:
        return self.fleet.producer(
            name, count=self.per_producer, batch=20, pause=0.1, payload='{"sleep": 0.03}'
        )

    @property
    def publishing(self) -> list[str]:
        return [name for name, process in self.producers.items() if process.alive]

    def producers_done(self) -> bool:
        for process in self.producers.values():
            if not process.alive:
                assert process.process.returncode == 0, process.log()
        return not self.publishing

    def step(self) -> bool:
        """One kill when it is time; ``True`` once the loop is over."""
        if self.producers_done() and sum(self.kills.values()) >= 20:
            return True
        now = time.monotonic()
        if now < self.next_step:
            return False
        self.next_step = now + self.rng.uniform(0.3, 0.6)
        publishing = self.publishing
        if publishing and (self.kills["producer"] <= self.kills["worker"]):
            name = self.rng.choice(publishing)
            self.fleet.inject(self.producers[name], "kill")
            self.producers[name] = self._producer(name)
            self.kills["producer"] += 1
        else:
            # A worker at work: one still starting holds nothing to redeliver.
            ready = [n for n, worker in enumerate(self.workers) if worker.ready_path.exists()]
            if not ready:
                return False
            index = self.rng.choice(ready)
            self.fleet.inject(self.workers[index], "kill")
            self.workers[index] = self.fleet.worker(**WORKER)
            self.kills["worker"] += 1
        return False


@pytest.mark.slow
def test_sqlite_survives_processes_killed_in_a_loop(sqlite_url: str, tmp_path: Path) -> None:
    per_producer = scaled(1000)
    total = PRODUCERS * per_producer
    path = sqlite_path(sqlite_url)
    with Fleet(sqlite_url, tmp_path) as fleet, SizeSampler(path + "-wal") as wal:
        loop = KillLoop(fleet, per_producer, seed=3)
        deadline = time.monotonic() + scaled_seconds(600)
        while not loop.step():
            assert time.monotonic() < deadline, "the kill loop did not finish"
            time.sleep(0.05)
        wait_finished(sqlite_url, [QUEUE], total, timeout=300)
        statuses = fleet.stop_all()
        assert set(statuses.values()) == {0}, fleet.logs()
        events = fleet.events()

    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    verdict = fleet.verdict([QUEUE], events=events, lease=WORKER["lease"])
    print(dict(loop.kills), f"max WAL {wal.maximum} B in {wal.samples} samples", verdict.summary())
    verdict.assert_clean()
    assert verdict.published == verdict.completed == total
    assert loop.kills["producer"] >= 5
    assert loop.kills["worker"] >= 5
    assert verdict.duplicates["worker killed"] > 0
    # Producers saw no error at all: busy waits stay inside the API (killed producers leave
    # no record of their last batch; their successors publish it again).
    assert not [e for e in events if e["op"] == "publish" and e["status"] != "ok"]
    problems = {
        name: PROBLEMS.findall(text) for name, text in fleet.logs().items() if PROBLEMS.search(text)
    }
    assert not problems, problems
    assert 0 < wal.maximum <= WAL_BOUND, wal.maximum
