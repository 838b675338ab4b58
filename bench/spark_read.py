"""Spark batch read of PostgreSQL, one run, two source trees: which read path is faster.

    .venv/bin/python bench/spark_read.py --before /path/to/old/src [--rows 200000] [--rounds 3]

Before issue 24's Spark plugin, PostgreSQL was read through two SQL paths (ADBC, as Arrow
batches, by default; psycopg rows turned into Arrow when ``adbc=false``); the plugin keeps
one. This fills one database with N messages, then times
``spark.read.format("sqlbroker").load()`` of all of them into Spark's ``noop`` sink, once
per round for each variant, interleaved: ``before/psycopg``, ``before/adbc`` (the tree given
by ``--before``) and ``after`` (this tree). Each variant runs in a fresh process with its
own SparkSession; the read is timed twice there and the second (warm) read is reported.

Results go to ``bench/results/spark_read.json`` and ``bench/results/spark_read.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def child(url: str, adbc: str | None) -> None:
    from pyspark.sql import SparkSession

    from sqlbroker.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlbroker-spark-read-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    seconds = []
    for _ in range(2):
        reader = spark.read.format("sqlbroker").option("url", url).option("partitions", "4")
        if adbc is not None:
            reader = reader.option("adbc", adbc)
        started = time.perf_counter()
        reader.load().write.format("noop").mode("overwrite").save()
        seconds.append(time.perf_counter() - started)
    spark.stop()
    print(json.dumps(seconds))


def fill(url: str, rows: int) -> None:
    import sqlbroker

    with sqlbroker.Broker(url, migrate=True) as broker:
        broker.subscribe("bench", "#")
        for start in range(0, rows, 5_000):
            broker.publish_many(
                [
                    {"topic": "orders.created", "payload": {"order_id": n, "customer": f"c-{n}"}}
                    for n in range(start, min(rows, start + 5_000))
                ]
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=False, help="the src/ directory of the old tree")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "spark_read"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--adbc", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        child(arguments.child, arguments.adbc)
        return
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PostgresServer

    server = PostgresServer(durable=True).start()
    try:
        server.create_database("spark_read")
        url = str(server.url("spark_read"))
        fill(url, arguments.rows)
        variants: dict[str, tuple[str, str | None]] = {"after": (str(REPO / "src"), None)}
        if arguments.before:
            variants = {
                "before/psycopg": (arguments.before, "false"),
                "before/adbc": (arguments.before, "auto"),
                **variants,
            }
        timings: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(arguments.rounds):
            for name, (src, adbc) in variants.items():
                command = [sys.executable, __file__, "--child", url]
                if adbc is not None:
                    command += ["--adbc", adbc]
                env = {**os.environ, "PYTHONPATH": src}
                done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                warm = json.loads(done.stdout.strip().splitlines()[-1])[1]
                timings[name].append(warm)
                print(f"{name}: {warm:.2f} s", flush=True)
    finally:
        server.stop()
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": arguments.rows,
        "load_average": os.getloadavg(),
        "seconds": timings,
        "median_rows_per_s": {
            name: round(arguments.rows / statistics.median(values))
            for name, values in timings.items()
        },
    }
    out = Path(arguments.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# Spark batch read of PostgreSQL: before and after one read path",
        "",
        f"{results['started']} · `bench/spark_read.py --rows {arguments.rows}` ·"
        f" {arguments.rounds} interleaved rounds · load average at end"
        f" {', '.join(f'{x:.1f}' for x in results['load_average'])}",
        "",
        "| variant | warm read (s), each round | median rows/s |",
        "|---|---|---|",
    ]
    for name, values in timings.items():
        cells = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {name} | {cells} | {results['median_rows_per_s'][name]:,} |")
    lines += [
        "",
        "All N messages of the queue table, 4 partitions, `local[2]`, into the `noop` sink;"
        " each variant in a fresh process (the first, cold read is not counted).",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
