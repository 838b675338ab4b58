"""The archive pipeline as a program: ``python -m sqlbroker.spark.pipeline`` or
``spark-submit …/sqlbroker/spark/pipeline.py``.

    export --url URL --out ROOT --older-than 30d [--keep] [--partitions N]
    report --source ROOT --out DIR
    run    --url URL --out ROOT --older-than 30d --report DIR

``--master`` chooses the Spark master; without it, the program runs on the master that
``spark-submit``, ``PYSPARK_SUBMIT_ARGS`` or ``spark-defaults.conf`` gives, else on
``local[*]``. Exit status: 0 done,
2 invalid arguments, 1 anything else (nothing deleted unless the export was verified).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import datetime, timedelta
from typing import Any

from sqlbroker.core.errors import SqlbrokerError, ValidationError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` (or a number of seconds)."""
    value = text.strip()
    try:
        return timedelta(seconds=float(value))
    except ValueError:
        pass
    match = _DURATION.fullmatch(value)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 30d, 12h or 90s)")
    return timedelta(seconds=float(match.group(1)) * _UNIT[match.group(2)])


def session(app: str = "sqlbroker-pipeline", master: str | None = None) -> Any:
    """The active SparkSession, or a new one on ``master``, else on the master that
    ``spark-submit``, ``PYSPARK_SUBMIT_ARGS`` or ``spark-defaults.conf`` gives, else on
    ``local[*]``."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            # As on the default local[*]: no web UI to start for a run on this machine.
            builder = builder.config("spark.ui.enabled", "false")
    else:
        # Starts the JVM as spark-submit would (PYSPARK_SUBMIT_ARGS, spark-defaults.conf),
        # or finds the one spark-submit started; its settings then show in SparkConf.
        SparkContext._ensure_initialized()
        if not SparkConf().contains("spark.master"):
            builder = builder.master("local[*]").config("spark.ui.enabled", "false")
    # Our progress display replaces Spark's console progress bar, which would garble it.
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sqlbroker.spark.pipeline")
    commands = parser.add_subparsers(dest="command", required=True)

    def export_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--url", default=os.environ.get("SQLBROKER_URL"), required=False)
        command.add_argument("--out", required=True, help="export root (a path or URI)")
        command.add_argument("--older-than", type=parse_age, required=True, dest="older_than")
        command.add_argument(
            "--keep", action="store_true", help="a dry run: export and verify, then discard"
        )
        command.add_argument("--partitions", type=int, default=4)
        command.add_argument("--schema", help="PostgreSQL schema")

    export = commands.add_parser("export", help="export, verify, then delete old rows")
    export_options(export)
    report = commands.add_parser("report", help="reports from an export root")
    report.add_argument("--source", required=True)
    report.add_argument("--out", required=True, help="local directory for CSV/JSON/HTML")
    run = commands.add_parser("run", help="export, then report")
    export_options(run)
    run.add_argument("--report", required=True, help="local directory for CSV/JSON/HTML")
    for command in (export, report, run):
        command.add_argument(
            "--master", help="Spark master (default: spark-submit's, else local[*])"
        )
        command.add_argument("--json", action="store_true", help="print the result as JSON")
        command.add_argument("--quiet", action="store_true", help="no progress display")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    if arguments.command in ("export", "run") and not arguments.url:
        print("error: --url (or $SQLBROKER_URL) is required", file=sys.stderr)
        return 2
    try:
        return _run(arguments)
    except SqlbrokerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ValidationError) else 1


def _run(arguments: argparse.Namespace) -> int:
    from sqlbroker.spark import report as reports
    from sqlbroker.spark.export import ArchiveExport
    from sqlbroker.spark.progress import PipelineProgress

    spark = session(master=arguments.master)
    output: dict[str, Any] = {}
    with PipelineProgress(spark, enabled=not arguments.quiet) as progress:
        if arguments.command in ("export", "run"):
            options = {"schema": arguments.schema} if arguments.schema else {}
            exporter = ArchiveExport(
                spark,
                url=arguments.url,
                root=arguments.out,
                partitions=arguments.partitions,
                step=progress.step,
                backend_options=options,
            )
            from sqlbroker.spark.options import Connection

            with Connection.of({"url": arguments.url, **options}).session() as (broker, _):
                now: datetime = broker.backend.now()
            result = exporter.run(cutoff=now - arguments.older_than, delete=not arguments.keep)
            output["export"] = result.as_json()
        if arguments.command in ("report", "run"):
            source = arguments.source if arguments.command == "report" else arguments.out
            target = arguments.out if arguments.command == "report" else arguments.report
            computed = reports.compute(spark, source, step=progress.step)
            page = reports.write(computed, target)
            output["report"] = {"html": str(page), "summary": computed.summary}
    if arguments.json:
        print(json.dumps(output, indent=2, default=str))
    else:
        if "export" in output:
            done = output["export"]
            print(
                f"exported {done['archive_rows']} archive rows and {done['dead_rows']} dead"
                f" letters older than {done['cutoff']} to {done['root']}"
                + (" and deleted them from the database" if done["deleted"] else " (kept)")
            )
        if "report" in output:
            print(f"report: {output['report']['html']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
