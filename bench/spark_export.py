"""The archive export: export + verify + delete of N archive rows, step by step.

    PYTHONPATH=src .venv/bin/python bench/spark_export.py [--rows 1000000]
        [--backend postgresql|sqlite|both] [--before /path/to/old/src] [--rounds 1]

On a fresh database per run: N completed copies spread evenly over the last three UTC days,
4 topics, inserted by SQL (the set-up is not timed); on PostgreSQL the archive's daily
partitions of those days are created first, as the reaper does
(``archive_partitions_maintain``). Then, in a process of its own, a SparkSession on
``local[2]`` made as ``sqlbroker pipeline`` makes it (``pipeline.session``; its start is
timed as the step ``session``), and ``ArchiveExport(...).run(cutoff=<today 00:00 UTC>)``:
Parquet by date and topic, verified, then removed from the database. The export is timed
from the call to its return, with each step's share. With ``--before``, the old tree runs
the same export on an identical database in the same run, interleaved with this tree
(before, after, before, after, … for ``--rounds``). ``--commit-only`` times only the
removal (``export_commit`` of the whole range, as the export calls it after verifying),
without Spark (PostgreSQL).

Results go to ``--out`` + ``.json`` / ``.md`` (default ``bench/results/spark_export``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def today() -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def fill_postgres(url: str, rows: int) -> None:
    import psycopg

    import sqlbroker

    first = today() - timedelta(days=3)
    with sqlbroker.Broker(url, migrate=True, clock=sqlbroker.ManualClock(first)) as broker:
        broker.subscribe("bench", "#")
        broker.backend.archive_partitions_maintain(ahead=4, keep=366 * 86400.0)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO sqlbroker_archive (
                delivery_id, message_id, subscription, topic, outcome, priority, payload,
                content_type, attempts, max_attempts, replay_count, enqueued_at,
                first_started_at, finished_at)
            SELECT n, gen_random_uuid(), 'bench',
                   (ARRAY['orders.created', 'orders.paid', 'mail.sent', 'audit.login'])[n %% 4 + 1],
                   'completed', 0,
                   convert_to('{"order_id": ' || n || ', "customer": "c-' || n %% 1000 || '"}',
                              'UTF8'),
                   'application/json', 1, 5, 0, f.at - interval '1 second', f.at, f.at
            FROM generate_series(1, %(rows)s) n,
                 LATERAL (SELECT %(first)s::timestamptz
                          + (n::float8 / %(rows)s) * interval '3 days' - interval '1 ms' AS at) f
            """,
            {"rows": rows, "first": first},
        )
        conn.execute("VACUUM ANALYZE sqlbroker_archive")


def fill_sqlite(url: str, rows: int) -> None:
    import sqlite3

    import sqlbroker
    from sqlbroker.storage.url import parse_url

    with sqlbroker.Broker(url, migrate=True) as broker:
        broker.subscribe("bench", "#")
    path = parse_url(url).path
    assert path is not None
    first = (today() - timedelta(days=3)).timestamp()
    with sqlite3.connect(path) as conn:
        conn.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows)
            INSERT INTO sqlbroker_archive (
                delivery_id, message_id, subscription, topic, outcome, priority, payload,
                content_type, attempts, max_attempts, replay_count, enqueued_at,
                first_started_at, finished_at)
            SELECT i, lower(hex(randomblob(16))), 'bench',
                   CASE i % 4 WHEN 0 THEN 'orders.created' WHEN 1 THEN 'orders.paid'
                              WHEN 2 THEN 'mail.sent' ELSE 'audit.login' END,
                   'completed', 0,
                   CAST('{"order_id": ' || i || ', "customer": "c-' || i % 1000 || '"}' AS BLOB),
                   'application/json', 1, 5, 0, at - 1, at, at
            FROM (SELECT i, :first + (i * 1.0 / :rows) * 3 * 86400 - 0.001 AS at FROM n)
            """,
            {"rows": rows, "first": first},
        )
    with sqlite3.connect(path) as conn:
        conn.execute("ANALYZE")


def child(url: str, root: str) -> None:
    from sqlbroker.spark.export import ArchiveExport
    from sqlbroker.spark.pipeline import session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    began = time.perf_counter()
    spark = session(master="local[2]")
    spark_started = time.perf_counter() - began
    marks: list[tuple[str, float]] = []
    export = ArchiveExport(
        spark, url=url, root=root, step=lambda s: marks.append((s, time.perf_counter()))
    )
    started = time.perf_counter()
    result = export.run(cutoff=today())
    ended = time.perf_counter()
    marks.append(("end", ended))
    steps = {"session": round(spark_started, 2)}
    steps.update(
        (" ".join(name.split(" ")[:2]), round(marks[i + 1][1] - at, 2))
        for i, (name, at) in enumerate(marks[:-1])
    )
    print(
        json.dumps(
            {
                "seconds": round(ended - started, 2),
                "archive_rows": result.archive_rows,
                "deleted": result.deleted,
                "steps_s": steps,
            }
        ),
        flush=True,
    )
    spark.stop()


def commit_only(url: str) -> None:
    import sqlbroker
    from sqlbroker.spark.storage import ExportRun, SparkRowFilter, open_store

    with sqlbroker.Broker(url) as broker:
        store = open_store(broker, url=url, options={})
        found = store.id_range(where=SparkRowFilter(table="archive", until=today()))
        assert found is not None
        started = time.perf_counter()
        store.export_commit(run=ExportRun("bench", today(), found.high, 0, found.count, 0))
        seconds = time.perf_counter() - started
        left = store.id_range(where=SparkRowFilter(table="archive"))
    print(
        json.dumps(
            {
                "seconds": round(seconds, 2),
                "archive_rows": found.count,
                "deleted": left is None,
                "steps_s": {"export_commit": round(seconds, 2)},
            }
        ),
        flush=True,
    )


def _run_child(arguments: argparse.Namespace, url: str, root: Path, src: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            *(["--commit-only"] if arguments.commit_only else []),
            "--child",
            url,
            str(root),
        ],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    run: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--before", help="the src/ directory of the old tree")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS / "spark_export"))
    parser.add_argument("--commit-only", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        if arguments.commit_only:
            commit_only(arguments.child[0])
        else:
            child(*arguments.child)
        return
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PostgresServer

    variants = {"after": str(REPO / "src")}
    if arguments.before:
        variants = {"before": arguments.before, **variants}
    backends = ["postgresql", "sqlite"] if arguments.backend == "both" else [arguments.backend]
    if arguments.commit_only:
        backends = ["postgresql"]
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": arguments.rows,
        "trees": variants,
        "runs": [],
    }
    work = Path(tempfile.mkdtemp(prefix="sqlbroker-spark-export-"))
    server = PostgresServer(durable=True).start() if "postgresql" in backends else None
    index = 0
    try:
        for round_ in range(1, arguments.rounds + 1):
            for backend in backends:
                for variant, src in variants.items():
                    index += 1
                    if backend == "postgresql":
                        assert server is not None
                        server.create_database(f"export_{index}")
                        url = str(server.url(f"export_{index}"))
                        fill_postgres(url, arguments.rows)
                    else:
                        url = f"sqlite:///{work}/export_{index}.db"
                        fill_sqlite(url, arguments.rows)
                    load = os.getloadavg()[0]
                    run = _run_child(arguments, url, work / f"root_{index}", src)
                    run.update(
                        variant=variant,
                        backend=backend,
                        round=round_,
                        load_average=round(max(load, os.getloadavg()[0]), 1),
                    )
                    print(json.dumps(run), flush=True)
                    results["runs"].append(run)
                    shutil.rmtree(work / f"root_{index}", ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(arguments.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# Archive export: export + verify + delete",
        "",
        f"{results['started']} · `bench/spark_export.py --rows {arguments.rows}"
        f" --backend {arguments.backend} --rounds {arguments.rounds}"
        f"{' --commit-only' if arguments.commit_only else ''}` (2 cores,"
        " shared with other work: compare rows of this run)",
        "",
        "| round | backend | tree | rows | export + verify + delete (s) | steps (s) | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        steps = "; ".join(f"{k}: {v}" for k, v in run["steps_s"].items())
        lines.append(
            f"| {run['round']} | {run['backend']} | {run['variant']} | {run['archive_rows']:,}"
            f" | **{run['seconds']}** | {steps} | {run['load_average']:.1f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
