"""The archive export of a time-partitioned PostgreSQL archive: export + verify + delete.

    PYTHONPATH=src .venv/bin/python bench/spark_export.py [--rows 1000000]
        [--before /path/to/old/src]

On a fresh database per variant: the archive's daily partitions of the last three UTC days
(created as the reaper does, ``archive_partitions_maintain``), N completed copies spread
evenly over those days (inserted by SQL: the set-up is not timed), 4 topics. Then, in a
process of its own with ``local[2]``, ``ArchiveExport(...).run(cutoff=<today 00:00 UTC>)``:
Parquet by date and topic, verified by per-partition counts and checksums against the
database, then removed from it. Timed from the call to its return, with each step's share.
With ``--before``, the old tree runs the same export on an identical database in the same
run (it deletes the rows; this tree drops the exported days). ``--commit-only`` times only
the removal (``export_commit`` of the whole range, as the export calls it after verifying),
without Spark.

Results go to ``bench/results/spark_export.json`` and ``bench/results/spark_export.md``.
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


def fill(url: str, rows: int) -> None:
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


def child(url: str, root: str) -> None:
    from pyspark.sql import SparkSession

    from sqlbroker.spark.export import ArchiveExport

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlbroker-spark-export-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    marks: list[tuple[str, float]] = []
    export = ArchiveExport(
        spark, url=url, root=root, step=lambda s: marks.append((s, time.perf_counter()))
    )
    started = time.perf_counter()
    result = export.run(cutoff=today())
    ended = time.perf_counter()
    marks.append(("end", ended))
    steps = {
        name.split(" ")[0] + " " + name.split(" ")[1]: round(marks[i + 1][1] - at, 2)
        for i, (name, at) in enumerate(marks[:-1])
    }
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
        left = broker.backend.table_counts().get("sqlbroker_archive", 0)
    print(
        json.dumps(
            {
                "seconds": round(seconds, 2),
                "archive_rows": found.count,
                "deleted": left == 0,
                "steps_s": {"export_commit": round(seconds, 2)},
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--before", help="the src/ directory of the old tree")
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
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": arguments.rows,
        "runs": [],
    }
    work = Path(tempfile.mkdtemp(prefix="sqlbroker-spark-export-"))
    server = PostgresServer(durable=True).start()
    try:
        for index, (variant, src) in enumerate(variants.items()):
            server.create_database(f"export_{index}")
            url = str(server.url(f"export_{index}"))
            fill(url, arguments.rows)
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    *(["--commit-only"] if arguments.commit_only else []),
                    "--child",
                    url,
                    str(work / variant),
                ],
                env={**os.environ, "PYTHONPATH": src},
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run.update(variant=variant, load_average=os.getloadavg()[0])
            print(json.dumps(run), flush=True)
            results["runs"].append(run)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(arguments.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# Archive export of a time-partitioned PostgreSQL archive",
        "",
        f"{results['started']} · `bench/spark_export.py --rows {arguments.rows}"
        f"{' --commit-only' if arguments.commit_only else ''}` (2 cores,"
        " shared with other work: compare rows of this run)",
        "",
        "| tree | rows | export + verify + delete (s) | steps (s) | load (1 min) |",
        "|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        steps = "; ".join(f"{k}: {v}" for k, v in run["steps_s"].items())
        lines.append(
            f"| {run['variant']} | {run['archive_rows']:,} | **{run['seconds']}** | {steps} |"
            f" {run['load_average']:.1f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
