"""CPU per message of each publish path, client and server: what limits a rate when the
machine is shared (CPU seconds do not depend on who else runs, wall time does).

    PYTHONPATH=src .venv/bin/python bench/cpu_costs.py [--messages 4000] [--repeats 3]

Each (system, workload) runs in a fresh process — sqlbroker's through
``bench/compare_trees.py --run-one`` (``PYTHONPATH`` as given), the peers' through their
own environment — twice, with ``N`` and ``N/4`` messages, so that what does not depend on
the count (interpreter start, imports, schema, connections) cancels:
``(cpu(N) - cpu(N/4)) / (3N/4)``. *client* is the process's CPU (all its threads, its
worker processes), *server* the PostgreSQL server's (every backend plus the WAL writer and
the other background processes), *statements* the executions per message by
``pg_stat_statements``. Writes ``results/cpu_costs.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness
import peers
import psycopg
from harness import BENCH_DIR, DEFAULT, Database, PostgresTarget, Sizes

CASES = (
    ("sqlbroker", "publish.single"),
    ("sqlbroker", "publish.single.async"),
    ("pgqueuer", "publish.single"),
    ("floor", "publish.single"),
    ("sqlbroker", "publish.batch"),
    ("sqlbroker", "publish.batch.async"),
    ("floor", "publish.batch.unnest"),
    ("floor", "publish.batch.copy"),
    ("pgmq", "publish.batch.client"),
    ("pgmq", "publish.batch.sql"),
)
STATEMENTS = """
SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND query NOT ILIKE '%%pg_stat_statements%%'
"""


def children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def run_child(system: str, workload: str, database: Database, sizes: Sizes) -> dict[str, Any]:
    request = {
        "workload": workload,
        "database": dataclasses.asdict(database),
        "sizes": dataclasses.asdict(sizes),
    }
    if system == "sqlbroker":
        command = [sys.executable, str(BENCH_DIR / "compare_trees.py"), "--run-one"]
        done = subprocess.run([*command, json.dumps(request)], capture_output=True, text=True)
        if done.returncode:
            raise harness.BenchError(done.stderr[-2000:])
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    if system == "floor":
        code = (
            "import json, sys, dataclasses; sys.path.insert(0, sys.argv[1]);"
            " from harness import Database, Sizes; from systems import pg_floor;"
            " r = json.loads(sys.argv[2]);"
            " s = {**pg_floor.WORKLOADS, **pg_floor.ONE_METHOD}[r['workload']]("
            "Database(**r['database']), Sizes(**{k: tuple(v) if isinstance(v, list) else v"
            " for k, v in r['sizes'].items()}));"
            " print(json.dumps({'metrics': s.metrics, 'details': s.details}))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(BENCH_DIR), json.dumps(request)],
            capture_output=True,
            text=True,
            cwd=BENCH_DIR,
        )
        if done.returncode:
            raise harness.BenchError(done.stderr[-2000:])
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    process = peers.PeerProcess(system)
    try:
        sample = process.request(workload, database, sizes)
    finally:
        process.close()
    return {"metrics": sample.metrics, "details": sample.details}


def measure(
    root: int, target: PostgresTarget, system: str, workload: str, sizes: Sizes
) -> dict[str, float]:
    with target.fresh() as database:
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        client0, server0 = children_cpu(), harness._tree_cpu(root)
        answer = run_child(system, workload, database, sizes)
        client1, server1 = children_cpu(), harness._tree_cpu(root)
        with psycopg.connect(database.url, autocommit=True) as conn:
            row = conn.execute(STATEMENTS).fetchone()
        assert row is not None
    return {
        "client_s": client1 - client0,
        "server_s": server1 - server0,
        "statements": float(row[0]),
        "rate": float(answer["metrics"]["rate"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    args = parser.parse_args()
    big, small = args.messages, args.messages // 4

    def sized(n: int) -> Sizes:
        return dataclasses.replace(DEFAULT, publish_single=n, publish_batch=n, batch_size=500)

    peers.ensure_venv(lambda line: print(line, file=sys.stderr))
    server = harness.start_postgres()
    rows: dict[tuple[str, str], list[dict[str, float]]] = {c: [] for c in CASES}
    try:
        server.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.restart()
        root = int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])
        harness.OWN_ROOTS[:] = [root]
        target = PostgresTarget(server)
        for repeat in range(args.repeats):
            for system, workload in CASES:
                one = measure(root, target, system, workload, sized(big))
                few = measure(root, target, system, workload, sized(small))
                per = big - small
                found = {
                    "client_us": (one["client_s"] - few["client_s"]) / per * 1e6,
                    "server_us": (one["server_s"] - few["server_s"]) / per * 1e6,
                    "statements": (one["statements"] - few["statements"]) / per,
                    "rate": one["rate"],
                }
                rows[(system, workload)].append(found)
                shown = ", ".join(f"{k}={v:,.2f}" for k, v in found.items())
                print(f"[{repeat + 1}] {system} {workload}: {shown}", file=sys.stderr)
    finally:
        server.stop()
    table = {
        f"{s}:{w}": {k: round(statistics.median(r[k] for r in found), 3) for k in found[0]}
        for (s, w), found in rows.items()
        if found
    }
    report = {
        "messages": [big, small],
        "repeats": args.repeats,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "machine": harness.machine_info(),
        "medians": table,
        "samples": {f"{s}:{w}": found for (s, w), found in rows.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_costs.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        "# CPU per message of each publish path (`bench/cpu_costs.py`)",
        "",
        f"{report['machine']['date']} · commit `{(report['machine']['git_commit'] or '?')[:12]}`"
        f" · ({big:,} − {small:,} messages), medians of {args.repeats} · load average"
        f" {report['load_avg_at_end']} at the end · fsync probe"
        f" {report['machine']['fsync_probe_ms']} ms. CPU seconds do not depend on the"
        " machine's other load; the rate (msg/s, wall clock) does.",
        "",
        "| system | workload | client µs/msg | server µs/msg | statements/msg | msg/s |",
        "|---|---|---|---|---|---|",
    ]
    for key, m in table.items():
        system, workload = key.split(":")
        lines.append(
            f"| {system} | `{workload}` | {m['client_us']:,.1f} | {m['server_us']:,.1f} |"
            f" {m['statements']:.3f} | {m['rate']:,.0f} |"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "cpu_costs.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
