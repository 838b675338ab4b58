"""Helpers for the fault scenarios: the size knob, producer and consumer processes, a
PostgreSQL server of a test's own, and the database-side measurements the scenarios assert.

Producers and consumers are separate OS processes (``python -m reliability.<module>`` with
``tests/`` on ``PYTHONPATH``), configured by ``SQLBROKER_*`` environment variables, each
writing its own history file (see ``history.py``) into the scenario's directory.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pgserver import PostgresServer
from reliability.history import Event
from runtime.support import TESTS_DIR, wait_until

SCALE = float(os.environ.get("SQLBROKER_FAULTS_SCALE", "1") or 1)
"""Multiplies message counts and durations: 1 in CI, 10 under ``make faults-long``."""


def scaled(value: float, *, minimum: float = 1) -> float:
    return max(minimum, value * SCALE)


def scaled_count(value: int, *, minimum: int = 1) -> int:
    return max(minimum, round(value * SCALE))


class Agent:
    """One ``python -m reliability.<module>`` process of a scenario.

    ``options`` become ``SQLBROKER_<NAME>`` environment variables; the process is told its
    name, the database URL, the history directory and a ready file to create."""

    def __init__(self, module: str, *, url: str, workdir: Path, name: str, **options: Any) -> None:
        self.name = name
        self.ready_path = workdir / f"{name}.ready"
        self.log_path = workdir / f"{name}.log"
        python_path = [str(TESTS_DIR)]
        if os.environ.get("PYTHONPATH"):
            python_path.append(os.environ["PYTHONPATH"])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(python_path),
            "SQLBROKER_URL": url,
            "SQLBROKER_HISTORY": str(workdir),
            "SQLBROKER_NAME": name,
            "SQLBROKER_READY": str(self.ready_path),
        }
        for option, value in options.items():
            if value is not None:
                env[f"SQLBROKER_{option.upper()}"] = str(value)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"reliability.{module}"],
                env=env,
                cwd=TESTS_DIR,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, pid={self.pid}, rc={self.process.poll()})"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self, tail: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if not self.alive:
                raise AssertionError(
                    f"{self.name} exited ({self.process.returncode}) before it was ready:\n"
                    f"{self.log()}"
                )
            return self.ready_path.exists()

        wait_until(ready, timeout=timeout, what=f"{self.name} to be ready", interval=0.1)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout:g} s:\n{self.log()}"
            ) from None

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait for the exit status."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait(timeout=30)


@contextmanager
def agents() -> Iterator[list[Agent]]:
    """A list to start agents into; any still running at the end are killed (by pid)."""
    started: list[Agent] = []
    try:
        yield started
    finally:
        for agent in started:
            agent.kill()


def consumer(url: str, workdir: Path, name: str, **options: Any) -> Agent:
    """A worker process (``pgfaults_consumer.py`` lists its options)."""
    return Agent("pgfaults_consumer", url=url, workdir=workdir, name=name, **options)


def producer(url: str, workdir: Path, name: str, **options: Any) -> Agent:
    """A publishing process (``pgfaults_producer.py`` lists its options)."""
    return Agent("pgfaults_producer", url=url, workdir=workdir, name=name, **options)


def wait_all(processes: Iterable[Agent], *, timeout: float) -> None:
    """Every process exits 0 within ``timeout`` seconds (altogether)."""
    deadline = time.monotonic() + timeout
    for process in processes:
        code = process.wait(max(1.0, deadline - time.monotonic()))
        assert code == 0, f"{process.name} exited {code}:\n{process.log()}"


# --- the database, read with plain drivers ---------------------------------------------------


def sqlite_path(url: str) -> str:
    return url.split("///", 1)[1].split("?", 1)[0]


def dbname(url: str) -> str:
    return unquote(urlsplit(url).path.lstrip("/"))


def scalar(url: str, statement: str) -> Any:
    """One value from a fresh driver connection (autocommit: it holds nothing open)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(url))
        try:
            return conn.execute(statement).fetchone()[0]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(statement.encode()).fetchone()
        assert row is not None
        return row[0]


def hot_rows(url: str) -> int:
    """Copies still in the hot table (waiting, scheduled or running)."""
    return int(scalar(url, "SELECT count(*) FROM sqlbroker_message"))


def wait_drained(url: str, *, timeout: float) -> None:
    wait_until(lambda: hot_rows(url) == 0, timeout=timeout, what="the queue to drain", interval=0.2)


def terminate_backends(url: str, *, application_prefix: str, only_listeners: bool = False) -> int:
    """``pg_terminate_backend`` every session of ``url``'s database whose application name
    starts with ``application_prefix`` (the listener's alone with ``only_listeners``);
    return how many were signalled."""
    import psycopg

    statement = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND starts_with(application_name, %(prefix)s)"
        " AND (NOT %(listeners)s OR query ILIKE 'LISTEN %%')"
    )
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(
            statement, {"prefix": application_prefix, "listeners": only_listeners}
        ).fetchone()
    assert row is not None
    return int(row[0])


def listening_backends(url: str) -> int:
    return int(
        scalar(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'LISTEN %'",
        )
    )


# --- a PostgreSQL server of the test's own ---------------------------------------------------


@dataclass
class Restart:
    """One ``pg_ctl restart``: monotonic times of the command and of the server's return."""

    began: float
    back: float

    @property
    def seconds(self) -> float:
        return self.back - self.began


class OwnServer:
    """A throwaway PostgreSQL server for one scenario, so the session's shared server is
    never restarted. It keeps PostgreSQL's durable defaults (the session's server turns
    ``synchronous_commit`` off for speed): a caller's own transaction, which a publish
    with ``conn=`` joins, commits with the server's setting, and with it off a commit
    acknowledged just before a ``-m immediate`` restart is lost — by design, not a fault."""

    def __init__(self) -> None:
        self.server = PostgresServer(durable=True)

    def start(self, database: str = "faults") -> str:
        import sqlbroker

        self.server.start()
        self.server.create_database(database)
        url = self.server.url(database)
        with sqlbroker.Broker(url, migrate=True) as broker:
            broker.migrate()
        return url

    def restart(self) -> Restart:
        began = time.monotonic()
        self.server.restart("immediate")
        return Restart(began, time.monotonic())

    def stop(self) -> None:
        self.server.stop()


# --- measurements from the histories ---------------------------------------------------------


def completions(events: Sequence[Event]) -> list[float]:
    """Monotonic times of every committed completion, sorted."""
    return sorted(e["mono"] for e in events if e["op"] == "settled" and e["kind"] == "complete")


def first_after(moments: Sequence[float], start: float) -> float | None:
    return next((moment for moment in moments if moment > start), None)


def pickup_latencies(events: Sequence[Event]) -> dict[str, float]:
    """Per tag: from the producer's ``ok`` (the commit returned) to the first handler start."""
    published = {
        e["tag"]: e["mono"] for e in events if e["op"] == "publish" and e["status"] == "ok"
    }
    started: dict[str, float] = {}
    for event in events:
        if event["op"] == "deliver" and event.get("tag") in published:
            started.setdefault(event["tag"], event["mono"])
    return {tag: started[tag] - published[tag] for tag in published if tag in started}


def describe(values: Iterable[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "none"
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"n={len(ordered)} median={statistics.median(ordered):.3f}s p99={p99:.3f}s"
        f" max={ordered[-1]:.3f}s"
    )
