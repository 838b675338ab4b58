"""A stream against a worker on the same backlog: who drains N messages faster.

    PYTHONPATH=src .venv/bin/python bench/spark_stream.py [--rows 200000]
        [--backends sqlite,postgresql] [--max-batch 50000] [--starts cold,warm]
        [--before OLD/src] [--repeat 2]

For each backend, on a fresh database, N messages are published to a queue and drained,
each drain in a process of its own, one after the other on the same backlog size:

* ``worker``: a plain worker (``@broker.subscriber(queue=…, concurrency=4)``, an async
  no-op handler) until ``run_until_idle`` returns;
* ``stream max_batch=M``: ``spark.readStream.format("sqlbroker")`` of the queue into
  Parquet (``local[2]``, 2 partitions, trigger ``processingTime="0 seconds"``), from
  ``start()`` until every message is acknowledged (none left in the queue), then the
  Parquet is counted (N rows, none lost). A *cold* stream is a query's first: its
  executors start their Python workers inside the clock. A *warm* one starts them before
  (a batch read of the data source), as the worker's clock starts after its imports and
  its first connection: the two bracket what a long-running stream sees.

The worker's clock starts once its broker is open (imports and connection done) and
stops when ``run_until_idle`` returns; the stream's starts at ``start()`` (the Spark
session is up) and stops when the last message is acknowledged. Both run alone on the
machine's cores, beside the same PostgreSQL server.

Results go to ``bench/results/spark_stream.json`` and ``bench/results/spark_stream.md``.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
QUEUE = "bench"


def fill(url: str, rows: int) -> None:
    import sqlbroker

    with sqlbroker.Broker(url, migrate=True) as broker:
        for start in range(0, rows, 5_000):
            broker.send_many(
                QUEUE,
                [
                    {"order_id": n, "customer": f"c-{n}"}
                    for n in range(start, min(rows, start + 5_000))
                ],
            )


def anything_left(url: str) -> Any:
    """A probe of whether any message is left, cheap enough to run every 0.1 s beside the
    drain (counting every table, as the old ``table_counts`` did, took a share of the two cores
    the stream was measured on)."""
    if url.startswith("sqlite"):
        import sqlite3

        from sqlbroker.storage.url import parse_url

        path = parse_url(url).path
        assert path is not None

        def probe_sqlite() -> bool:
            with sqlite3.connect(path) as conn:
                return (
                    conn.execute("SELECT 1 FROM sqlbroker_message LIMIT 1").fetchone() is not None
                )

        return probe_sqlite
    import psycopg

    conn = psycopg.connect(url, autocommit=True)

    def probe_postgres() -> bool:
        return conn.execute("SELECT 1 FROM sqlbroker_message LIMIT 1").fetchone() is not None

    return probe_postgres


def worker(url: str, rows: int) -> dict[str, Any]:
    import sqlbroker

    handled = 0
    with sqlbroker.Broker(url) as broker:

        @broker.subscriber(queue=QUEUE, concurrency=4)
        async def drain(message: sqlbroker.Message) -> None:
            nonlocal handled
            handled += 1

        broker.stats()
        started = time.perf_counter()
        broker.run_until_idle(timeout=1800)
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "handled": handled}


def stream(url: str, rows: int, max_batch: int, work: str, warm: bool) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from sqlbroker.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlbroker-spark-stream-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if warm:
        # Before the clock, as the worker's imports and connections are: the executors'
        # Python workers start and import sqlbroker (a batch read of the empty dead-letter
        # table), so the first micro-batch does not pay for it.
        spark.read.format("sqlbroker").option("url", url).option("table", "dead").load().count()
    frame = (
        spark.readStream.format("sqlbroker")
        .option("url", url)
        .option("subscription", QUEUE)
        .option("max_batch", str(max_batch))
        .load()
    )
    started = time.perf_counter()
    query = (
        frame.writeStream.format("parquet")
        .option("path", f"{work}/out")
        .option("checkpointLocation", f"{work}/checkpoint")
        .trigger(processingTime="0 seconds")
        .start()
    )
    left = anything_left(url)

    def check() -> None:
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        time.sleep(0.1)

    # Spark's progress first (no database query), then the last batch's acknowledgement.
    while sum(p["numInputRows"] for p in query.recentProgress) < rows:
        check()
    while left():
        check()
    seconds = time.perf_counter() - started
    progress = [
        {"batch": p["batchId"], "rows": p["numInputRows"], "ms": p["durationMs"]}
        for p in query.recentProgress
        if p["numInputRows"]
    ]
    batches = len(query.recentProgress)
    query.stop()
    written = spark.read.parquet(f"{work}/out").count()
    spark.stop()
    return {"seconds": seconds, "handled": written, "micro_batches": batches, "batches": progress}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--max-batch", default="50000")
    parser.add_argument("--out", default=str(RESULTS / "spark_stream"))
    parser.add_argument(
        "--before",
        help="the src folder of an older tree: its stream runs too, in the same run, for a"
        " before/after comparison",
    )
    parser.add_argument(
        "--starts",
        default="cold",
        help="cold, warm or both (cold,warm): a warm stream's executors start their Python"
        " workers before the clock (see stream())",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds, interleaved")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        kind, url, work = arguments.child
        if kind == "worker":
            result = worker(url, arguments.rows)
        else:
            size, _, start = kind.partition(":")
            result = stream(url, arguments.rows, int(size), work, start == "warm")
        print(json.dumps(result), flush=True)
        return
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PostgresServer

    trees = [("", str(REPO / "src"))]
    if arguments.before:
        trees.insert(0, ("before: ", arguments.before))
    variants = [("worker", "", str(REPO / "src"))] + [
        (f"{size}:{start}", label, src)
        for start in arguments.starts.split(",")
        for label, src in trees
        for size in arguments.max_batch.split(",")
    ]
    variants *= arguments.repeat
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": arguments.rows,
        "runs": [],
    }
    work = Path(tempfile.mkdtemp(prefix="sqlbroker-spark-stream-"))
    server = None
    try:
        for backend in arguments.backends.split(","):
            for index, (variant, label, src) in enumerate(variants):
                if backend == "sqlite":
                    url = f"sqlite:///{work}/stream-{index}.db"
                else:
                    if server is None:
                        server = PostgresServer(durable=True).start()
                    server.create_database(f"stream_{index}")
                    url = str(server.url(f"stream_{index}"))
                fill(url, arguments.rows)
                folder = work / f"{backend}-{index}"
                folder.mkdir()
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--rows",
                        str(arguments.rows),
                        "--child",
                        variant,
                        url,
                        str(folder),
                    ],
                    env={**os.environ, "PYTHONPATH": src},
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-3000:])
                run = json.loads(done.stdout.strip().splitlines()[-1])
                run.update(
                    backend=backend,
                    variant="worker"
                    if variant == "worker"
                    else f"{label}{variant.partition(':')[2]} stream"
                    f" max_batch={variant.partition(':')[0]}",
                    msg_per_s=round(arguments.rows / run["seconds"]),
                    load_average=os.getloadavg()[0],
                )
                print(json.dumps(run), flush=True)
                results["runs"].append(run)
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(arguments.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# A stream against a worker on the same backlog",
        "",
        f"{results['started']} · `bench/spark_stream.py --rows {arguments.rows}` (2 cores,"
        " shared with other work: compare rows of one backend, run one after the other)",
        "",
        "| backend | drain | seconds | msg/s | stream/worker | delivered | micro-batches |"
        " load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worker_rate: dict[str, int] = {}
    for run in results["runs"]:
        if run["variant"] == "worker":
            worker_rate[run["backend"]] = run["msg_per_s"]
        base = worker_rate.get(run["backend"])
        ratio = "" if run["variant"] == "worker" or not base else f"{run['msg_per_s'] / base:.2f}"
        lines.append(
            f"| {run['backend']} | {run['variant']} | {run['seconds']:.1f} |"
            f" {run['msg_per_s']:,} | {ratio} | {run['handled']:,} |"
            f" {run.get('micro_batches', '')} | {run['load_average']:.1f} |"
        )
    lines += [
        "",
        "Spark's own time per micro-batch with rows (ms, from `query.recentProgress`):",
        "",
    ]
    for run in results["runs"]:
        for batch in run.get("batches", []):
            phases = ", ".join(f"{k} {v:,}" for k, v in sorted(batch["ms"].items()))
            lines.append(
                f"- {run['backend']} batch {batch['batch']} ({batch['rows']:,} rows): {phases}"
            )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
