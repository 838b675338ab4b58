"""Helpers for the fault scenarios: the size knob, producer and consumer processes, a
PostgreSQL server of a test's own, and the database-side measurements the scenarios assert.

Producers and consumers are separate OS processes (``python -m reliability.<module>`` with
``tests/`` on ``PYTHONPATH``), configured by ``SQLBROKER_*`` environment variables, each
writing its own history file (see ``history.py``) into the scenario's directory.
"""

from __future__ import annotations

import signal
import sqlite3
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pgserver import PostgresServer
from reliability.history import Event
from reliability.processes import sqlite_path
from runtime.support import ModuleProcess, wait_until


class Agent(ModuleProcess):
    """One ``python -m reliability.<module>`` process of a scenario, told its name, the
    database URL and the history directory; ``options`` become ``SQLBROKER_<NAME>``."""

    def __init__(self, module: str, *, url: str, workdir: Path, name: str, **options: Any) -> None:
        super().__init__(
            f"reliability.{module}",
            workdir,
            name,
            env={"SQLBROKER_URL": url, "SQLBROKER_HISTORY": str(workdir), "SQLBROKER_NAME": name},
            **options,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        super().wait_ready(timeout)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait for the exit status."""
        if self.alive:
            self.send(signal.SIGTERM)
        return self.wait(timeout)


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
