"""Real ``celery worker`` processes on sqlbroker, both backends: a worker SIGKILLed mid-task
loses nothing (``acks_late`` tasks come back after the lease and run again), a task longer
than several leases runs once (the lease keeper extends it), priorities order a backlog, a
countdown runs from the database, and a task no worker knows is dead-lettered, not dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlbroker
from runtime.support import wait_until

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"

APP = """\
import json
import os
import time

import sqlbroker.contrib.celery  # registers sqlbroker+… broker URLs
from celery import Celery

app = Celery("shop", broker=os.environ["BROKER_URL"])
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 1
app.conf.broker_transport_options = json.loads(os.environ["TRANSPORT_OPTIONS"])


def _note(name, line):
    with open(name, "a") as log:  # one write per line: a SIGKILL cannot tear it
        log.write(f"{line}\\n")


@app.task(name="shop.work")
def work(n, seconds=0.0):
    _note("started.log", n)
    time.sleep(seconds)
    _note("done.log", n)
"""


class Workers:
    """``celery worker`` processes in their own process groups, in one directory."""

    def __init__(self, directory: Path, url: str, options: str) -> None:
        self.directory = directory
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(SRC), str(directory)]),
            "BROKER_URL": f"sqlbroker+{url}",
            "TRANSPORT_OPTIONS": options,
        }
        self.processes: list[subprocess.Popen[bytes]] = []
        (directory / "shop_app.py").write_text(APP, encoding="utf-8")

    def send(self, *calls: tuple[int, float, int]) -> None:
        """Enqueue ``shop.work(n, seconds)`` with ``priority`` for each call, from a
        producer process of its own."""
        lines = "".join(
            f"work.apply_async(({n}, {seconds}), priority={priority})\n"
            for n, seconds, priority in calls
        )
        subprocess.run(
            [sys.executable, "-c", f"from shop_app import work\n{lines}"],
            cwd=self.directory,
            env=self.env,
            check=True,
        )

    def start(self, name: str, concurrency: int = 1) -> subprocess.Popen[bytes]:
        with (self.directory / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "shop_app", "worker"),
                    *("-c", str(concurrency), "-n", f"{name}@%h", "-l", "INFO"),
                    *("--without-mingle", "--without-gossip", "--without-heartbeat"),
                ],
                cwd=self.directory,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def lines(self, name: str) -> list[int]:
        path = self.directory / name
        if not path.exists():
            return []
        return [int(line) for line in path.read_text(encoding="utf-8").split()]

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and its pool's children, as a lost host would."""
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        """A warm shutdown (SIGTERM): running tasks finish, then the worker exits."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def workers(
    broker: sqlbroker.Broker, backend_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Workers]:
    options = getattr(request, "param", '{"visibility_timeout": 3}')
    fleet = Workers(tmp_path, backend_url, options)
    try:
        yield fleet
    finally:
        fleet.close()


def _settled(broker: sqlbroker.Broker, count: int) -> bool:
    return len(broker.archive("celery", outcome="completed", limit=1000)) == count


def test_a_sigkilled_worker_loses_nothing(workers: Workers, broker: sqlbroker.Broker) -> None:
    tasks = list(range(12))
    workers.send(*((n, 1.0, 0) for n in tasks))
    first = workers.start("first", concurrency=2)
    wait_until(lambda: len(workers.lines("started.log")) >= 2, timeout=60, what="tasks to start")
    workers.kill(first)
    cut_short = set(workers.lines("started.log")) - set(workers.lines("done.log"))
    assert cut_short, "the worker died mid-task"

    second = workers.start("second", concurrency=2)
    wait_until(
        lambda: set(workers.lines("done.log")) == set(tasks), timeout=120, what="every task done"
    )
    wait_until(lambda: _settled(broker, len(tasks)), timeout=30, what="every ack committed")
    workers.stop(second)

    started = Counter(workers.lines("started.log"))
    assert all(started[n] >= 2 for n in cut_short), "the killed worker's tasks ran again"
    assert broker.pending("celery") == []
    assert broker.dead_letters.list() == []


@pytest.mark.parametrize("workers", ['{"visibility_timeout": 1}'], indirect=True)
def test_a_task_longer_than_its_lease_runs_once(workers: Workers, broker: sqlbroker.Broker) -> None:
    """Two workers, a one-second lease and a four-second task: were the lease not extended,
    the idle worker would take the task while it runs."""
    one = workers.start("one")
    two = workers.start("two")
    workers.send((1, 4.0, 0))
    wait_until(lambda: _settled(broker, 1), timeout=60, what="the long task to complete")
    assert workers.lines("started.log") == [1]
    workers.stop(one)
    workers.stop(two)
    assert workers.lines("started.log") == [1], "nobody ran it a second time"


def test_a_backlog_runs_most_urgent_first_a_countdown_waits_and_an_unknown_task_is_kept(
    workers: Workers, broker: sqlbroker.Broker
) -> None:
    workers.send((5, 0.0, 5), (9, 0.0, 9), (0, 0.0, 0), (3, 0.0, 3))
    subprocess.run(
        [sys.executable, "-c", "from shop_app import work\nwork.apply_async((42,), countdown=2)"],
        cwd=workers.directory,
        env=workers.env,
        check=True,
    )
    assert [m.state.value for m in broker.pending("celery")].count("scheduled") == 1
    subprocess.run(
        [sys.executable, "-c", "from shop_app import app\napp.send_task('shop.unknown')"],
        cwd=workers.directory,
        env=workers.env,
        check=True,
    )
    worker = workers.start("only")
    wait_until(lambda: _settled(broker, 5), timeout=60, what="the backlog and the countdown")
    wait_until(broker.dead_letters.list, timeout=30, what="the unknown task dead-lettered")
    workers.stop(worker)
    (unknown,) = broker.dead_letters.list(subscription="celery")
    assert unknown.reason == "rejected by Celery"
    assert unknown.payload["headers"]["task"] == "shop.unknown"
    done = workers.lines("done.log")
    assert [n for n in done if n != 42] == [0, 3, 5, 9]
    assert 42 in done, "the countdown ran (its place depends on when the worker started)"
