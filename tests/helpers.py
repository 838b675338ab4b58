"""Helpers shared by the test modules (importable by spawned worker processes too)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import psycopg

import sqlbroker

# SQLite stores times as REAL seconds (float rounding), PostgreSQL as microseconds.
TIME_TOLERANCE = timedelta(milliseconds=1)


def assert_time(
    actual: datetime | None, expected: datetime, tolerance: timedelta = TIME_TOLERANCE
) -> None:
    """``actual`` is an aware datetime within ``tolerance`` of ``expected``."""
    assert actual is not None, f"expected a time near {expected.isoformat()}, got None"
    assert actual.tzinfo is not None, f"{actual!r} is naive"
    assert actual.utcoffset() == timedelta(0), f"{actual!r} is not UTC"
    assert abs(actual - expected) <= tolerance, f"{actual.isoformat()} != {expected.isoformat()}"


def now_of(clock: sqlbroker.ManualClock) -> datetime:
    now = clock.now()
    assert now is not None
    return now


def table_counts(backend: Any) -> dict[str, int]:
    """The row count of every table of sqlbroker's schema (but its version table), read
    through a transaction's own connection: tests compare them before and after a call
    that must write nothing. The tables are listed from the catalog, so a new one is
    counted without anyone remembering to add it (PostgreSQL's archive partitions are
    counted through the archive)."""
    with backend.begin() as tx:
        conn = tx.connection
        if backend.name == "sqlite":
            listed = "SELECT name FROM sqlite_master WHERE type = 'table'"
            prefix = ""
        else:
            schema = backend.settings.schema
            listed = (
                "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') AND NOT relispartition"
                f" AND relnamespace = {'current_schema()' if schema is None else repr(schema)}"
                "::regnamespace"
            )
            prefix = "" if schema is None else f'"{schema}".'
        names = sorted(
            name
            for (name,) in conn.execute(listed).fetchall()
            if name.startswith("sqlbroker_") and name != "sqlbroker_schema_version"
        )
        return {
            name: conn.execute(f'SELECT count(*) FROM {prefix}"{name}"').fetchone()[0]
            for name in names
        }


def stats_of(broker: sqlbroker.Broker, subscription: str) -> sqlbroker.SubscriptionStats:
    found = [s for s in broker.stats() if s.subscription == subscription]
    assert len(found) == 1, f"no stats row for {subscription!r}: {broker.stats()}"
    return found[0]


def claim_one(broker: sqlbroker.Broker, subscription: str, **options: Any) -> sqlbroker.Delivery:
    deliveries = broker.claim(subscription, **options)
    assert len(deliveries) == 1, f"expected one delivery from {subscription!r}, got {deliveries}"
    return deliveries[0]


def process_claim_worker(
    url: str, queue: str, batch: int, barrier: Any, results: Any, worker_index: int
) -> None:
    """Run in a spawned process: claim from ``queue`` until it is empty, completing every
    delivery, and report ``(worker_index, [(delivery_id, message_id), ...])``."""
    claimed: list[tuple[int, str]] = []
    error: str | None = None
    try:
        with sqlbroker.Broker(url, lease=120.0) as broker:
            broker.stats()  # connect and check the schema before the race starts
            barrier.wait(timeout=60)
            while True:
                deliveries = broker.claim(queue, limit=batch, worker=f"proc-{worker_index}")
                if not deliveries:
                    break
                claimed.extend((d.id, d.message_id) for d in deliveries)
                broker.complete(deliveries)
    except BaseException as exc:  # report, so the parent fails with the cause
        error = f"{type(exc).__name__}: {exc}"
    results.put((worker_index, claimed, error))


class RefusingExecutor(ThreadPoolExecutor):
    """A default executor that refuses work: asyncio's default executor is user code's,
    and what sqlbroker runs must bring its own threads."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        raise AssertionError("sqlbroker used the loop's default executor")


def loop_resources(url: str, application: str) -> Callable[[], int]:
    """A count of what brokers hold for their event loops, taken from outside: on
    PostgreSQL the sessions named ``application`` (``pg_stat_activity``, read through
    ``url``), on SQLite the backends' threads — those of every SQLite broker of the
    process, so compare with a count taken before."""
    if url.startswith("sqlite"):
        return lambda: sum(t.name.startswith("sqlbroker-sqlite") for t in threading.enumerate())

    def sessions() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application,)
            ).fetchone()
        assert row is not None
        return int(row[0])

    return sessions
