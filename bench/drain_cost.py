"""The worker drain's cost per message, in counts that do not depend on the machine's load.

    PYTHONPATH=src .venv/bin/python bench/drain_cost.py [--messages 5000] [--repeats 2]

Drains ``N`` and ``2N`` pre-published messages with ``bench/consumer.py`` (the
``drain.runtime.prefetch10`` workload: concurrency 4, prefetch 10) and prints, per message
of the difference (start-up and idle detection cancel out): the worker process's CPU
(user + system, from ``RUSAGE_CHILDREN``), the server's CPU (the postmaster's process tree),
statements and server time by statement (pg_stat_statements) and WAL bytes.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
from typing import Any

import harness
import psycopg
from harness import Consumer, PostgresTarget
from systems import sqlbroker_system

STATEMENTS = """
SELECT calls, total_exec_time, rows, wal_bytes,
       regexp_replace(left(query, 70), '\\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE query NOT ILIKE '%%pg_stat_statements%%' AND query NOT ILIKE '%%pg_current_wal%%'
"""


PROFILED = """
import cProfile, sys, time
out = sys.argv[1]
sys.argv[1:2] = []
sys.path.insert(0, "bench")
import consumer
profile = cProfile.Profile(time.process_time)
profile.enable()
try:
    consumer.main()
finally:
    profile.disable()
    profile.dump_stats(out)
"""
"""bench/consumer.py under cProfile counting CPU time (not wall time: waits are not work)."""


def _one(target: PostgresTarget, count: int) -> dict[str, Any]:
    with target.fresh() as database:
        sqlbroker_system.prepublish(database, count)
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("CHECKPOINT")
            conn.execute("SELECT pg_stat_statements_reset()")
            (start_lsn,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or (None,)
        root = harness.OWN_ROOTS[0]
        server_before = harness._tree_cpu(root)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        args = ["sqlbroker", "drain", "--url", database.url, "--concurrency", "4"]
        args += ["--prefetch", "10", "--expect", str(count)]
        with Consumer(*args, timeout=600) as consumer:
            done = consumer.finish()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server = harness._tree_cpu(root) - server_before
        assert done["handled"] == count, done
        with psycopg.connect(database.url, autocommit=True) as conn:
            (wal,) = conn.execute(
                "SELECT pg_current_wal_lsn() - %s::pg_lsn", (start_lsn,)
            ).fetchone() or (0,)
            rows = conn.execute(STATEMENTS).fetchall()
    statements = {row[4]: row[:4] for row in rows}
    return {
        "client": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "server": server,
        "wal": float(wal),
        "statements": statements,
        "calls": sum(v[0] for v in statements.values()),
        "exec_ms": sum(v[1] for v in statements.values()),
    }


def _instructions(target: PostgresTarget, count: int, tree: str | None) -> int:
    """Instructions (callgrind) the worker process spent draining ``count`` messages."""
    with target.fresh() as database:
        sqlbroker_system.prepublish(database, count)
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
        command += [sys.executable, str(harness.BENCH_DIR / "consumer.py"), "sqlbroker", "drain"]
        command += ["--url", database.url, "--concurrency", "4", "--prefetch", "10"]
        env = dict(os.environ)
        if tree is not None:
            env["PYTHONPATH"] = f"{tree}/src"
        done = subprocess.run(
            [*command, "--expect", str(count)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=harness.REPO_DIR,
        )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    assert found is not None, done.stderr[-2000:]
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--callgrind",
        nargs="*",
        metavar="TREE",
        help="instead: the worker's instructions per message (callgrind, N vs 2N) of each"
        " source tree (its src/ on the worker's path; none: this one)",
    )
    parser.add_argument("--profile", help="also run one drain under cProfile, into this file")
    args = parser.parse_args()
    server = harness.start_postgres()
    try:
        server.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.restart()
        pid_file = server.data_dir / "postmaster.pid"
        harness.OWN_ROOTS[:] = [int(pid_file.read_text().splitlines()[0])]
        target = PostgresTarget(server)
        n = args.messages
        if args.callgrind is not None:
            for tree in args.callgrind or [None]:
                low, high = (_instructions(target, count, tree) for count in (n, 2 * n))
                print(f"{tree or '.'}: {(high - low) / n:,.0f} instructions/message", flush=True)
            return
        if args.profile:
            with target.fresh() as database:
                sqlbroker_system.prepublish(database, n)
                command = [sys.executable, "-c", PROFILED, args.profile, "sqlbroker", "drain"]
                command += ["--url", database.url, "--concurrency", "4", "--prefetch", "10"]
                subprocess.run(
                    [*command, "--expect", str(n)],
                    check=True,
                    capture_output=True,
                    cwd=harness.REPO_DIR,
                )
        if args.repeats < 1:
            return
        results: dict[int, list[dict[str, Any]]] = {n: [], 2 * n: []}
        for _ in range(args.repeats):
            for count in (n, 2 * n):
                results[count].append(_one(target, count))

        def best(count: int, key: str) -> float:
            return min(r[key] for r in results[count])

        for key, unit, scale in (
            ("client", "us CPU", 1e6),
            ("server", "us CPU", 1e6),
            ("exec_ms", "us exec", 1e3),
            ("calls", "statements", 1),
            ("wal", "WAL bytes", 1),
        ):
            values = [r[key] for r in results[n] + results[2 * n]]
            per = (best(2 * n, key) - best(n, key)) / n * scale
            print(f"{key:8} {per:9.2f} {unit}/message   (runs: {[round(v, 3) for v in values]})")
        last_n, last_2n = results[n][-1]["statements"], results[2 * n][-1]["statements"]
        print("per message of the difference, by statement (calls, exec us, rows, WAL B):")
        for query, (calls, total, rows, wal) in sorted(
            last_2n.items(), key=lambda item: -item[1][1]
        ):
            c0, t0, r0, w0 = last_n.get(query, (0, 0.0, 0, 0))
            print(
                f"  {(calls - c0) / n:7.4f} {(total - t0) / n * 1e3:8.2f}"
                f" {(rows - r0) / n:6.3f} {float(wal - w0) / n:8.1f}  {query}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
