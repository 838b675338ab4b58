"""Reports from an exported archive: tables as CSV and JSON, and one self-contained HTML page.

* throughput: completed messages per minute per topic;
* latency: end-to-end (enqueued to finished) p50/p95/p99 per topic and overall;
* attempts: how many attempts finished copies and dead letters took;
* dlq_rate: dead letters / (completed + dead letters) per topic;
* failure_reasons: the most frequent dead-letter reasons and exception types.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlbroker.spark.charts import render_html

TOP_REASONS = 10
TABLES = ("throughput", "latency", "attempts", "dlq_rate", "failure_reasons")


@dataclass
class Report:
    """Each table as a list of rows (dicts), in a stable order."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def _rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def _load(spark: Any, path: str) -> Any | None:
    from sqlbroker.spark.export import read_parquet
    from sqlbroker.spark.files import Files

    if not Files(spark, path).exists(path):
        return None
    return read_parquet(spark, path).cache()


def compute(spark: Any, root: str, *, step: Callable[[str], None] | None = None) -> Report:
    """Compute every table from the export under ``root``."""
    from pyspark.sql import functions as F

    say = step or (lambda _: None)
    root = root.rstrip("/")
    archive = _load(spark, f"{root}/archive")
    dead = _load(spark, f"{root}/dead")
    report = Report(tables={name: [] for name in TABLES})  # each empty without its data
    completed = None if archive is None else archive.where(F.col("outcome") == "completed")

    say("throughput per minute")
    if completed is not None:
        minute = F.date_trunc("minute", F.col("finished_at"))
        report.tables["throughput"] = _rows(
            completed.groupBy(F.date_format(minute, "yyyy-MM-dd HH:mm").alias("minute"), "topic")
            .agg(F.count("*").alias("messages"))
            .orderBy("minute", "topic")
        )

    say("latency percentiles")
    if completed is not None:
        seconds = F.col("finished_at").cast("double") - F.col("enqueued_at").cast("double")
        timed = completed.select("topic", seconds.alias("latency"))

        def percentiles(frame: Any) -> Any:
            return frame.agg(
                F.count("*").alias("messages"),
                F.percentile_approx("latency", 0.5, 10_000).alias("p50_s"),
                F.percentile_approx("latency", 0.95, 10_000).alias("p95_s"),
                F.percentile_approx("latency", 0.99, 10_000).alias("p99_s"),
            )

        per_topic = percentiles(timed.groupBy("topic")).orderBy("topic")
        overall = percentiles(timed).select(F.lit("(all)").alias("topic"), "*")
        report.tables["latency"] = _rows(per_topic) + _rows(overall)

    say("attempts, dead-letter rate and failure reasons")
    parts = []
    if completed is not None:
        parts.append(completed.select("attempts", F.lit("completed").alias("outcome"), "topic"))
    if dead is not None:
        parts.append(dead.select("attempts", F.lit("dead").alias("outcome"), "topic"))
    if parts:
        both = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        report.tables["attempts"] = _rows(
            both.groupBy("attempts", "outcome")
            .agg(F.count("*").alias("messages"))
            .orderBy("attempts", "outcome")
        )
        report.tables["dlq_rate"] = _rows(
            both.groupBy("topic")
            .agg(
                F.sum(F.when(F.col("outcome") == "completed", 1).otherwise(0)).alias("completed"),
                F.sum(F.when(F.col("outcome") == "dead", 1).otherwise(0)).alias("dead"),
            )
            .withColumn(
                "dlq_rate", F.round(F.col("dead") / (F.col("completed") + F.col("dead")), 6)
            )
            .orderBy("topic")
        )
    if dead is not None:
        report.tables["failure_reasons"] = _rows(
            dead.groupBy("reason", F.coalesce("error_type", F.lit("")).alias("error_type"))
            .agg(F.count("*").alias("messages"))
            .orderBy(F.desc("messages"), "reason")
            .limit(TOP_REASONS)
        )

    completed_count = sum(r["completed"] for r in report.tables["dlq_rate"])
    dead_count = sum(r["dead"] for r in report.tables["dlq_rate"])
    overall_latency = [r for r in report.tables["latency"] if r["topic"] == "(all)"]
    report.summary = {
        "completed": completed_count,
        "dead": dead_count,
        "other_archived": 0 if archive is None else archive.count() - completed_count,
        "topics": len({r["topic"] for r in report.tables["dlq_rate"]}),
        "dlq_rate": round(dead_count / (completed_count + dead_count), 6)
        if completed_count + dead_count
        else 0.0,
        "latency_p50_s": overall_latency[0]["p50_s"] if overall_latency else None,
        "latency_p95_s": overall_latency[0]["p95_s"] if overall_latency else None,
        "latency_p99_s": overall_latency[0]["p99_s"] if overall_latency else None,
    }
    for frame in (archive, dead):
        if frame is not None:
            frame.unpersist()
    return report


def _csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def write(report: Report, out: str | Path, *, title: str = "sqlbroker archive report") -> Path:
    """Write ``<table>.csv``, ``report.json`` and ``report.html`` into ``out`` (a local
    directory, created if needed); return the HTML file's path."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in report.tables.items():
        (folder / f"{name}.csv").write_text(_csv(rows), encoding="utf-8")
    (folder / "report.json").write_text(
        json.dumps({"summary": report.summary, **report.tables}, indent=2, default=str),
        encoding="utf-8",
    )
    page = folder / "report.html"
    page.write_text(render_html(report.tables, report.summary, title=title), encoding="utf-8")
    return page
