"""A soak with retention on, on simulated time: every simulated day a producer publishes
``--per-day`` messages that a consumer completes and ``--dead-per-day`` that it
dead-letters, and the reaper runs every 6 simulated hours (until a pass removes nothing),
for ``--days`` days, with the default retentions (archive 7 days, dead letters 30). The
archive, the dead letters and their size on disk must stop growing once the retention is
reached. Time moves by a ManualClock, never by sleeping. Appends its table to
``bench/results/retention_cost.md``.

    .venv/bin/python bench/retention_soak.py [--days 45] [--per-day 5000]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sqlbroker
from pgserver import PostgresServer

BATCH = 500


def _day(broker: sqlbroker.Broker, per_day: int, dead_per_day: int) -> None:
    for start in range(0, per_day, BATCH):
        count = min(BATCH, per_day - start)
        broker.send_many("soak", [{"n": start + i} for i in range(count)])
        broker.complete(broker.claim("soak", limit=count))
    for _ in range(dead_per_day):
        broker.send("soak", "poison")
        broker.dead_letter(broker.claim("soak")[0], reason="soak")


def _reap(broker: sqlbroker.Broker) -> None:
    while True:
        counts = broker.reap(limit=1000)
        if not counts["archive_trimmed"] and not counts["dead_trimmed"]:
            return


def _sizes_pg(url: str) -> tuple[int, int, int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM sqlbroker_archive),"
            " (SELECT count(*) FROM sqlbroker_dead),"
            " (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits"
            "  WHERE inhparent = 'sqlbroker_archive'::regclass)"
            " + pg_total_relation_size('sqlbroker_dead'),"
            " (SELECT count(*) FROM pg_inherits WHERE inhparent = 'sqlbroker_archive'::regclass)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def _sizes_sqlite(path: Path) -> tuple[int, int, int, int]:
    with sqlite3.connect(path) as conn:
        archived = conn.execute("SELECT count(*) FROM sqlbroker_archive").fetchone()[0]
        dead = conn.execute("SELECT count(*) FROM sqlbroker_dead").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    return int(archived), int(dead), int((pages - free) * size), 0


def soak(url: str, sizes: object, days: int, per_day: int, dead_per_day: int) -> list[str]:
    clock = sqlbroker.ManualClock()
    samples: list[str] = []
    with sqlbroker.Broker(url, clock=clock) as broker:
        broker.migrate()
        for day in range(1, days + 1):
            _day(broker, per_day, dead_per_day)
            for _ in range(4):
                clock.advance(timedelta(hours=6))
                _reap(broker)
            if day in (1, 7, 8, 15, 30, 31, days):
                archived, dead, used, parts = sizes()  # type: ignore[operator]
                samples.append(
                    f"day {day}: archive {archived:,} rows, dead {dead:,},"
                    f" {used / 1e6:.1f} MB in use" + (f", {parts} partitions" if parts else "")
                )
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=45)
    parser.add_argument("--per-day", type=int, default=5000)
    parser.add_argument("--dead-per-day", type=int, default=50)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "retention_cost.md"
    )
    args = parser.parse_args()
    results: list[tuple[str, list[str]]] = []
    with PostgresServer() as pg:
        url = pg.url()
        results.append(
            (
                "PostgreSQL",
                soak(url, lambda: _sizes_pg(url), args.days, args.per_day, args.dead_per_day),
            )
        )
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "soak.db"
        results.append(
            (
                "SQLite",
                soak(
                    f"sqlite:///{path}",
                    lambda: _sizes_sqlite(path),
                    args.days,
                    args.per_day,
                    args.dead_per_day,
                ),
            )
        )
    lines = [
        "",
        "## Soak with retention on (simulated days)",
        "",
        f"`bench/retention_soak.py --days {args.days} --per-day {args.per_day}"
        f" --dead-per-day {args.dead_per_day}`: each simulated day {args.per_day:,} messages"
        f" completed and {args.dead_per_day} dead-lettered, the reaper every 6 simulated hours,"
        " default retentions (archive 7 days, dead letters 30). Expected plateaus: about"
        f" {7 * args.per_day:,}–{8 * args.per_day:,} archive rows (PostgreSQL drops whole"
        f" days, so up to a day more) and {30 * args.dead_per_day:,} dead letters.",
        "",
        "| backend | after |",
        "|---|---|",
        *(f"| {backend} | {'<br>'.join(samples)} |" for backend, samples in results),
        "",
    ]
    with args.out.open("a", encoding="utf-8") as out:
        out.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
