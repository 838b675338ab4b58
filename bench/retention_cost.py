"""The reaper's cost of retention on a 1M-row archive: dropping a day (PostgreSQL's
partitioned archive, schema 13) against deleting the same day's rows (the unpartitioned
archive of schema 12, batches of 1,000 as the old ``archive_trim``; and SQLite, which
deletes rows), plus the claim+complete latency of a worker while each runs, and the time
migration 13 takes to convert a 1M-row archive.

One throwaway durable server (fsync on). The archive holds 8 days of 125,000 rows each
(211-byte payloads); the clock is moved so that exactly the oldest day is past the 7-day
retention. Row deletes run one batch (or reap pass) every 0.5 s, as a worker's reaper would
(every 5 s) but faster. Writes the Markdown table to ``bench/results/retention_cost.md``.

    .venv/bin/python bench/retention_cost.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sqlbroker
from pgserver import PostgresServer
from sqlbroker.storage.sql import load_blocks, load_migrations

DAYS = 8
PAUSE = 0.5
"""Seconds between two batches or reap passes (a worker's reaper waits 5 s)."""
PAYLOAD = "x" * 211
# Rows of the archive as a settle writes them, `per_day` per UTC day from `first_day`.
FILL_PG = """
INSERT INTO sqlbroker_archive (delivery_id, message_id, subscription, topic, outcome,
    priority, payload, content_type, attempts, max_attempts, replay_count, enqueued_at,
    first_started_at, finished_at)
SELECT g, gen_random_uuid(), 'jobs', 'jobs', 'completed', 2, convert_to(%(payload)s, 'UTF8'),
       'application/json', 1, 5, 0, t, t, t
FROM generate_series(1, %(rows)s) AS g,
     LATERAL (SELECT %(first_day)s::timestamptz
                     + (g - 1) / %(per_day)s * interval '1 day'
                     + ((g - 1) %% %(per_day)s) * (interval '1 day' / %(per_day)s) AS t) AS times
"""
FILL_SQLITE = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :rows)
INSERT INTO sqlbroker_archive (delivery_id, message_id, subscription, topic, outcome,
    priority, payload, content_type, attempts, max_attempts, replay_count, enqueued_at,
    first_started_at, finished_at)
SELECT n, lower(hex(randomblob(16))), 'jobs', 'jobs', 'completed', 2, CAST(:payload AS BLOB),
       'application/json', 1, 5, 0, t, t, t
FROM (SELECT n, :first_day + ((n - 1) / :per_day) * 86400.0
                + ((n - 1) % :per_day) * (86400.0 / :per_day) AS t FROM g)
"""
# Schema 12's archive_trim, on schema 12's unpartitioned archive.
OLD_TRIM = """
DELETE FROM sqlbroker_archive
WHERE id = ANY (ARRAY(
    SELECT id FROM sqlbroker_archive WHERE finished_at < %(older_than)s
    ORDER BY finished_at LIMIT %(limit)s
))
"""


class Latency:
    """A worker's claim+complete round trips on its own small queue while something runs."""

    def __init__(self, url: str, clock: sqlbroker.ManualClock | None = None) -> None:
        # The reaper's moved clock: its lease check must not take the worker's leases back.
        self._broker = sqlbroker.Broker(url, clock=clock)
        self._stop = threading.Event()
        self.samples: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        broker = self._broker
        while not self._stop.is_set():
            broker.send("latency", "ping")
            started = time.perf_counter()
            broker.complete(broker.claim("latency"))
            self.samples.append(time.perf_counter() - started)

    def __enter__(self) -> Latency:
        self._thread.start()
        time.sleep(0.5)
        self.samples.clear()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._broker.close()

    def summary(self) -> str:
        ordered = sorted(self.samples)
        if not ordered:
            return "-"
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return (
            f"p50 {statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms,"
            f" max {ordered[-1] * 1000:.1f} ms ({len(ordered)} round trips)"
        )


def _quiet_latency(url: str, seconds: float = 3.0) -> str:
    with Latency(url) as latency:
        time.sleep(seconds)
    return latency.summary()


# Schema 12's archive, for the comparison: the partitioned table swapped for one table with
# the same columns, defaults and indexes.
ONE_TABLE = """
ALTER TABLE sqlbroker_archive RENAME TO sqlbroker_archive_partitioned;
CREATE TABLE sqlbroker_archive (LIKE sqlbroker_archive_partitioned INCLUDING ALL);
"""


def _database(pg: PostgresServer, name: str) -> str:
    with psycopg.connect(pg.url(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return pg.url(name)


def _first_day() -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=DAYS - 1)


def _migrated_before_13(url: str) -> None:
    package = "sqlbroker.storage.postgres"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(load_blocks(package, "queries.sql")["schema_version_table"].encode())
        for version, title, script in load_migrations(f"{package}.migrations"):
            if title == "retention":
                break
            conn.execute(script.encode())
            conn.execute(
                "INSERT INTO sqlbroker_schema_version (version, name) VALUES (%s, %s)",
                (version, title),
            )


def _fill_pg(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            FILL_PG,
            {"rows": rows, "per_day": rows // DAYS, "first_day": _first_day(), "payload": PAYLOAD},
        )
        conn.execute("VACUUM ANALYZE sqlbroker_archive")


def bench_postgres(pg: PostgresServer, rows: int) -> list[tuple[str, str, str]]:
    results: list[tuple[str, str, str]] = []
    first = _first_day()
    clock = sqlbroker.ManualClock(first + timedelta(days=DAYS, hours=1))

    # Schema 12's shape: one unpartitioned table (with the same indexes); the day goes by
    # DELETEs of 1,000 rows, as schema 12's archive_trim would have done.
    old_url = _database(pg, "retention_delete")
    with sqlbroker.Broker(old_url) as broker:
        broker.migrate()
    with psycopg.connect(old_url, autocommit=True) as conn:
        conn.execute(ONE_TABLE)
    _fill_pg(old_url, rows)
    results.append(
        (
            "PostgreSQL, one table",
            "worker claim+complete, nothing else running",
            _quiet_latency(old_url),
        )
    )
    batches: list[float] = []
    with Latency(old_url) as latency, psycopg.connect(old_url, autocommit=True) as conn:
        started = time.perf_counter()
        while True:
            batch_started = time.perf_counter()
            deleted = conn.execute(
                OLD_TRIM, {"older_than": first + timedelta(days=1), "limit": 1000}
            ).rowcount
            batches.append(time.perf_counter() - batch_started)
            if deleted == 0:
                break
            time.sleep(PAUSE)
        total = time.perf_counter() - started
    results.append(
        (
            "PostgreSQL, one table (schema 12)",
            f"a day ({rows // DAYS:,} rows) by DELETE, 1,000 per batch",
            f"{sum(batches):.2f} s of deletes in {len(batches)} batches (median"
            f" {statistics.median(batches) * 1000:.1f} ms, max {max(batches) * 1000:.0f} ms;"
            f" {total:.0f} s with the pauses); worker: {latency.summary()}",
        )
    )

    # Migration 13 on a schema-12 database holding the whole archive.
    migrate_url = _database(pg, "retention_migrate")
    _migrated_before_13(migrate_url)
    _fill_pg(migrate_url, rows)
    started = time.perf_counter()
    with sqlbroker.Broker(migrate_url, migrate=False) as broker:
        broker.migrate()
    results.append(
        (
            "PostgreSQL",
            f"migration 13: convert a {rows:,}-row archive to daily partitions",
            f"{time.perf_counter() - started:.1f} s",
        )
    )

    # Schema 13: the partitioned archive; the day goes by one DROP.
    new_url = _database(pg, "retention_drop")
    with sqlbroker.Broker(new_url) as broker:
        broker.migrate()
    with psycopg.connect(new_url) as conn:
        for day in range(DAYS):
            conn.execute(
                "SELECT sqlbroker_archive_maintain(%s, 0, NULL::timestamptz)",
                (first + timedelta(days=day),),
            )
        conn.commit()
    _fill_pg(new_url, rows)
    results.append(
        (
            "PostgreSQL, partitioned",
            "worker claim+complete, nothing else running",
            _quiet_latency(new_url),
        )
    )
    with sqlbroker.Broker(new_url, clock=clock) as reaper, Latency(new_url, clock) as latency:
        started = time.perf_counter()
        counts = reaper.reap()
        first_pass = time.perf_counter() - started
        passes = [first_pass]
        for _ in range(20):
            started = time.perf_counter()
            reaper.reap()
            passes.append(time.perf_counter() - started)
    with psycopg.connect(new_url) as conn:
        (remaining,) = conn.execute(
            "SELECT count(*) FROM sqlbroker_archive WHERE subscription = 'jobs'"
        ).fetchone()  # type: ignore[misc]
    assert remaining == rows - rows // DAYS, (remaining, counts)
    results.append(
        (
            "PostgreSQL, schema 13 (daily partitions)",
            f"a day ({rows // DAYS:,} rows) by the reaper: one pass drops its partition",
            f"{first_pass * 1000:.0f} ms for the whole reap pass (rows deleted one by one:"
            f" {counts['archive_trimmed']}); later passes median"
            f" {statistics.median(passes[1:]) * 1000:.1f} ms; worker: {latency.summary()}",
        )
    )
    return results


def bench_sqlite(rows: int) -> list[tuple[str, str, str]]:
    first = _first_day()
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{directory}/archive.db"
        with sqlbroker.Broker(url) as broker:
            broker.subscribe("jobs", "jobs")
        with sqlite3.connect(f"{directory}/archive.db") as conn:
            conn.execute(
                FILL_SQLITE,
                {
                    "rows": rows,
                    "per_day": rows // DAYS,
                    "first_day": first.timestamp(),
                    "payload": PAYLOAD,
                },
            )
        quiet = _quiet_latency(url)
        clock = sqlbroker.ManualClock(first + timedelta(days=DAYS))
        passes: list[float] = []
        trimmed = 0
        with sqlbroker.Broker(url, clock=clock) as reaper, Latency(url, clock) as latency:
            started = time.perf_counter()
            while True:
                pass_started = time.perf_counter()
                counts = reaper.reap(limit=1000)
                passes.append(time.perf_counter() - pass_started)
                trimmed += counts["archive_trimmed"]
                if not counts["archive_trimmed"]:
                    break
                time.sleep(PAUSE)
            total = time.perf_counter() - started
        assert trimmed == rows // DAYS, trimmed
    return [
        ("SQLite", "worker claim+complete, nothing else running", quiet),
        (
            "SQLite",
            f"a day ({rows // DAYS:,} rows) by the reaper, 1,000 per pass",
            f"{sum(passes):.2f} s of reap passes in {len(passes)} passes (median"
            f" {statistics.median(passes) * 1000:.1f} ms, max {max(passes) * 1000:.0f} ms;"
            f" {total:.0f} s with the pauses); worker: {latency.summary()}",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "retention_cost.md"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    with PostgresServer(durable=True) as pg:
        results = bench_postgres(pg, args.rows)
        with psycopg.connect(pg.url()) as conn:
            (version,) = conn.execute("SHOW server_version").fetchone()  # type: ignore[misc]
    results += bench_sqlite(args.rows)
    lines = [
        "# Retention: the reaper's cost on a 1M-row archive",
        "",
        f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} · `bench/retention_cost.py --rows {args.rows}`"
        f" · {time.perf_counter() - started:.0f} s · {platform.machine()}, 2 shared cores ·"
        f" PostgreSQL {version} (fsync on) · SQLite {sqlite3.sqlite_version}",
        "",
        f"An archive of {args.rows:,} rows over {DAYS} days; the clock moved so that the oldest"
        " day is past the 7-day retention. Row deletes run a batch (or a reap pass) every"
        f" {PAUSE} s, as a worker's reaper does every 5 s. The worker column is a"
        " claim+complete loop on its own queue while the retention work runs. One run each,"
        " on a machine shared with other jobs (load average about 15 on 2 cores during this"
        " run): compare within a run, not across machines.",
        "",
        "| backend | what | cost |",
        "|---|---|---|",
        *(f"| {backend} | {what} | {cost} |" for backend, what, cost in results),
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
