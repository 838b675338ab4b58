"""Spark pipeline benchmark: write throughput and export + verify + report time.

    .venv/bin/python bench/spark_bench.py [--rows 1000000] [--backends sqlite,postgresql]

For each backend, on a fresh database:

* ``write``: ``df.write.format("sqlbroker")`` of an N-row DataFrame (staging by task, then
  the driver's one-transaction publish with deterministic idempotency keys), in messages/s;
* the N messages are then drained into the archive with batched claims and acks (1 % are
  dead-lettered), which is set-up and not timed as part of the pipeline;
* ``export``: archive + dead letters to Parquet partitioned by date and topic, verified by
  per-partition counts and checksums against the database, then deleted there;
* ``report``: throughput, latency percentiles, attempts, DLQ rate and failure reasons from
  the Parquet, written as CSV, JSON and HTML.

Results go to ``bench/results/spark.json`` and ``bench/results/spark.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from spark_write import messages_in_queue

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TOPICS = ("orders.created", "orders.paid", "mail.sent", "audit.login")
CLAIM = 1000


def machine() -> dict[str, Any]:
    import pyspark

    cpu = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "java": (java.stderr.splitlines() or ["?"])[0],
        "load_average": os.getloadavg(),
    }


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    from sqlbroker.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlbroker-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def drain(url: str, rows: int) -> float:
    """Claim and complete everything (1 % dead-lettered); return the seconds it took."""
    import sqlbroker
    from sqlbroker.core.settlements import Lease, Settlement

    started = time.perf_counter()
    with sqlbroker.Broker(url) as broker:
        backend = broker.backend
        done = 0
        while True:
            claimed = backend.message_claim_many(
                subscription="bench", limit=CLAIM, lease=300.0, worker="bench"
            )
            if not claimed:
                break
            backend.message_settle_many(
                settlements=[
                    Settlement.complete(Lease.of(d))
                    if d.id % 100
                    else Settlement.dead(Lease.of(d), ("declined", "timeout")[d.id % 200 == 0])
                    for d in claimed
                ]
            )
            done += len(claimed)
        assert done == rows, f"drained {done} of {rows}"
    return time.perf_counter() - started


def run_backend(spark: Any, name: str, url: str, rows: int, work: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import sqlbroker
    from sqlbroker.spark import report as reports
    from sqlbroker.spark.export import ArchiveExport

    with sqlbroker.Broker(url, migrate=True) as broker:
        broker.subscribe("bench", "#")
    frame = (
        spark.range(0, rows, 1, 4)
        .select(
            F.element_at(
                F.array(*[F.lit(t) for t in TOPICS]), (F.col("id") % 4 + 1).cast("int")
            ).alias("topic"),
            F.col("id").alias("order_id"),
            F.concat(F.lit("customer-"), (F.col("id") % 1000).cast("string")).alias("customer"),
            (F.col("id") * 0.25).alias("amount"),
        )
        .cache()
    )
    frame.count()
    print(f"[{name}] writing {rows:,} rows", flush=True)
    started = time.perf_counter()
    frame.write.format("sqlbroker").option("url", url).option("topic_column", "topic").mode(
        "append"
    ).save()
    write_s = time.perf_counter() - started
    frame.unpersist()
    with sqlbroker.Broker(url) as broker:
        published = messages_in_queue(broker, url)
    assert published == rows, f"{published} messages for {rows} rows"
    print(f"[{name}] write {write_s:.1f} s; draining into the archive", flush=True)
    drain_s = drain(url, rows)
    root = work / f"export-{name}"
    print(f"[{name}] drained in {drain_s:.1f} s; exporting", flush=True)
    with sqlbroker.Broker(url) as broker:
        cutoff = broker.backend.now() + timedelta(seconds=1)
    time.sleep(1.0)
    steps: list[tuple[str, float]] = []
    started = time.perf_counter()
    result = ArchiveExport(
        spark,
        url=url,
        root=str(root),
        partitions=4,
        step=lambda s: steps.append((s, time.perf_counter())),
    ).run(cutoff=cutoff)
    export_s = time.perf_counter() - started
    phases = {
        " ".join(w for w in label.split(" ")[:3] if not w.isdigit()): round(end - begin, 1)
        for (label, begin), (_, end) in zip(
            steps, [*steps[1:], ("end", time.perf_counter())], strict=True
        )
    }
    print(f"[{name}] export {export_s:.1f} s {phases}; reporting", flush=True)
    started = time.perf_counter()
    computed = reports.compute(spark, str(root))
    page = reports.write(computed, work / f"report-{name}")
    report_s = time.perf_counter() - started
    exported = result.archive_rows + result.dead_rows
    return {
        "backend": name,
        "rows": rows,
        "write_s": round(write_s, 2),
        "write_msg_per_s": round(rows / write_s),
        "drain_setup_s": round(drain_s, 2),
        "exported_rows": exported,
        "export_verify_delete_s": round(export_s, 2),
        "export_phases_s": phases,
        "report_s": round(report_s, 2),
        "export_verify_report_s": round(export_s + report_s, 2),
        "exported_rows_per_s": round(exported / export_s),
        "partitions": len(result.partitions),
        "report_html_bytes": page.stat().st_size,
        "summary": computed.summary,
    }


def markdown(results: dict[str, Any]) -> str:
    info = results["machine"]
    lines = [
        "# sqlbroker Spark pipeline benchmark",
        "",
        f"{results['started']} · `bench/spark_bench.py --rows {results['rows']}` ·"
        f" {results['seconds']:.0f} s",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB RAM ·"
        f" Python {info['python']} · PySpark {info['pyspark']} · {info['java']} ·"
        f" Spark `local[2]` · load average at start {info['load_average'][0]:.1f}",
        "",
        "| backend | write (msg/s) | write (s) | export + verify + delete (s) | report (s) |"
        " export + verify + report (s) | exported rows/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["backends"]:
        lines.append(
            f"| {r['backend']} | **{r['write_msg_per_s']:,}** | {r['write_s']} |"
            f" {r['export_verify_delete_s']} | {r['report_s']} |"
            f" **{r['export_verify_report_s']}** | {r['exported_rows_per_s']:,} |"
        )
    lines += [
        "",
        "Write: an N-row DataFrame (4 partitions, topic from a column, payload = the other"
        ' columns as JSON) through `df.write.format("sqlbroker")`, staging included, until'
        " the driver's one-transaction publish committed. Export: the archive (99 %) and the"
        " dead letters (1 %) of those N messages to Parquet partitioned by date and topic,"
        " per-partition count and checksum verification against a second read of the"
        " database, and the all-or-nothing delete. Report: every table plus the HTML page."
        " Draining the queue into the archive between the two is set-up, not timed.",
        "",
        "Phases of the export (s): "
        + "; ".join(f"{r['backend']}: {r['export_phases_s']}" for r in results["backends"]),
        "",
        "The machine has 2 cores shared with other work: treat differences under ~15 % as noise.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--out", default=str(RESULTS / "spark"))
    arguments = parser.parse_args()
    began = time.perf_counter()
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": arguments.rows,
        "machine": machine(),
        "backends": [],
    }
    spark = spark_session()
    work = Path(tempfile.mkdtemp(prefix="sqlbroker-spark-bench-"))
    server = None
    try:
        for name in arguments.backends.split(","):
            if name == "sqlite":
                url = f"sqlite:///{work}/bench.db"
            else:
                sys.path.insert(0, str(REPO / "tests"))
                from pgserver import PostgresServer

                server = PostgresServer(durable=True).start()
                server.create_database("spark_bench")
                url = server.url("spark_bench")
            results["backends"].append(run_backend(spark, name, url, arguments.rows, work))
    finally:
        spark.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["seconds"] = time.perf_counter() - began
    out = Path(arguments.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))


if __name__ == "__main__":
    main()
