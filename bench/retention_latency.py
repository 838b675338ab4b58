"""Claim and settle latency with an empty archive and with a large one (PostgreSQL, daily
partitions): a worker's claim+complete round trips on its own queue, first on a fresh
database, then after the archive was filled with ``--rows`` rows over 8 days (settles
insert into today's partition only, and claims never read the archive). Appends its table
to ``bench/results/retention_cost.md``.

    .venv/bin/python bench/retention_latency.py [--rows 10000000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from retention_cost import DAYS, Latency, _database, _fill_pg, _first_day

import sqlbroker
from pgserver import PostgresServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "retention_cost.md"
    )
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    with PostgresServer(durable=True) as pg:
        url = _database(pg, "retention_latency")
        with sqlbroker.Broker(url) as broker:
            broker.migrate()
        first = _first_day()
        with psycopg.connect(url, autocommit=True) as conn:
            for day in range(DAYS):
                conn.execute(
                    "SELECT sqlbroker_archive_maintain(%s, 0, NULL::timestamptz)",
                    (first + timedelta(days=day),),
                )
        with Latency(url) as latency:
            time.sleep(args.seconds)
        rows.append(("empty archive", latency.summary()))
        started = time.perf_counter()
        _fill_pg(url, args.rows)
        filled = time.perf_counter() - started
        with Latency(url) as latency:
            time.sleep(args.seconds)
        rows.append((f"{args.rows:,}-row archive (filled in {filled:.0f} s)", latency.summary()))
    lines = [
        "",
        f"## Claim+complete latency, empty archive and {args.rows:,} rows",
        "",
        f"`bench/retention_latency.py --rows {args.rows} --seconds {args.seconds:g}`:"
        f" one worker's claim+complete loop for {args.seconds:g} s on each, PostgreSQL with"
        f" daily partitions ({DAYS} days of rows), fsync on, same shared machine.",
        "",
        "| archive | claim+complete |",
        "|---|---|",
        *(f"| {what} | {cost} |" for what, cost in rows),
        "",
    ]
    with args.out.open("a", encoding="utf-8") as out:
        out.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
