"""Profile one workload of one system on a durable PostgreSQL with pg_stat_statements.

    .venv/bin/python bench/pgprofile.py [--system sqlbroker] [--workload drain.claim10]
                                      [--python-profile] [--quick] [--messages N]

Prints the statements by total server time (calls, mean and total ms, rows per call, WAL
bytes) and, with ``--python-profile``, the client's hottest functions (cProfile, by own
time). What the benchmark's numbers cannot say: where a gap to the floor comes from.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import sys
from typing import Any

import harness
import psycopg
import systems
from harness import DEFAULT, QUICK, PostgresTarget

STATEMENTS = """
SELECT calls, round(mean_exec_time::numeric, 3) AS mean_ms,
       round(total_exec_time::numeric, 1) AS total_ms, rows / greatest(calls, 1) AS rows_per_call,
       wal_bytes / greatest(calls, 1) AS wal_bytes_per_call,
       regexp_replace(left(query, 110), '\\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE query NOT ILIKE '%%pg_stat_statements%%'
ORDER BY total_exec_time DESC
LIMIT %s
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", default="sqlbroker", choices=["sqlbroker", "floor"])
    parser.add_argument("--workload", default="drain.claim10")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--python-profile", action="store_true")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--messages", type=int, help="publish and drain sizes")
    args = parser.parse_args()
    sizes = QUICK if args.quick else DEFAULT
    if args.messages:
        n = args.messages
        sizes = dataclasses.replace(sizes, publish_single=n, publish_batch=n, drain=n)
    server = harness.start_postgres()
    try:
        server.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.restart()
        target = PostgresTarget(server)
        module = systems.load(args.system)
        # sqlbroker's workloads of bench/targets.py and the floor's single batch paths too.
        run = {
            **module.WORKLOADS,
            **getattr(module, "TARGET_WORKLOADS", {}),
            **getattr(module, "ONE_METHOD", {}),
        }[args.workload]
        with target.fresh() as database:
            with psycopg.connect(database.url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
            profiler = cProfile.Profile() if args.python_profile else None
            # The preparation (schema, pre-publishing) is profiled too; reset just before
            # the measured part is not possible from outside, so compare call counts.
            if profiler is not None:
                profiler.enable()
            sample = run(database, sizes)
            if profiler is not None:
                profiler.disable()
            print(f"{args.system} {args.workload}: {sample.metrics}", file=sys.stderr)
            with psycopg.connect(database.url, autocommit=True) as conn:
                rows: list[Any] = conn.execute(STATEMENTS, (args.top,)).fetchall()
            print("calls | mean ms | total ms | rows/call | WAL B/call | statement")
            for row in rows:
                print(" | ".join(str(v) for v in row))
            if profiler is not None:
                print()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
