"""``sqlbroker pipeline export|report``: the Spark archive pipeline from the command line.

The pipeline runs as its own program (``python -m sqlbroker.spark.pipeline``, the same one
``spark-submit`` runs), so this command only checks its arguments, hands them over and
passes the exit status back. It needs the ``spark`` extra.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

import click

from sqlbroker.interfaces.cli.params import DURATION, json_option, options
from sqlbroker.interfaces.cli.session import CliFailure, Session, pass_session

_PROGRAM = "sqlbroker.spark.pipeline"


_MASTER_HELP = (
    "Spark master (spark://host:7077, local[4], …); default: the one PYSPARK_SUBMIT_ARGS or"
    " spark-defaults.conf names, else local[*]."
)


def _launch(
    arguments: list[str], *, as_json: bool, quiet: bool, master: str | None, url: str | None = None
) -> None:
    """Run the pipeline program with ``arguments`` and the flags both commands share; the
    URL goes through its environment, never its command line, where ``ps`` would show a
    password to every user of the host."""
    if importlib.util.find_spec("pyspark") is None:
        raise CliFailure("the pipeline needs the spark extra: pip install 'sqlbroker[spark]'")
    arguments = arguments + [flag for flag, on in (("--json", as_json), ("--quiet", quiet)) if on]
    if master is not None:
        arguments += ["--master", master]
    env = None if url is None else {**os.environ, "SQLBROKER_URL": url}
    status = subprocess.call([sys.executable, "-m", _PROGRAM, *arguments], env=env)
    if status:
        # The pipeline printed its own error line.
        sys.exit(status)


_launch_options = options(
    click.option("--quiet", is_flag=True, help="No progress display."),
    click.option("--master", metavar="URL", help=_MASTER_HELP),
)
"""The options of the pipeline program both commands pass on: ``--quiet``, ``--master``."""


@click.group()
def pipeline() -> None:
    """Export the archive to Parquet and report on it, with Spark (spark extra)."""


@pipeline.command()
@click.option("--out", required=True, metavar="ROOT", help="Export root: a directory or URI.")
@click.option(
    "--older-than",
    type=DURATION,
    required=True,
    help="Export rows finished (or dead) longer ago than this: 30d, 12h, 90s.",
)
@click.option(
    "--keep", is_flag=True, help="A dry run: export and verify, then discard; delete nothing."
)
@click.option("--partitions", type=click.IntRange(1, 10_000), default=4)
@json_option("Print the result as JSON.")
@_launch_options
@pass_session
def export(
    session: Session, out: str, older_than: float, keep: bool, partitions: int, **shared: Any
) -> None:
    """Export archive and dead letters older than a cutoff to Parquet (partitioned by date
    and topic), verify them against the database, then delete them there, all or nothing."""
    arguments = ["export", "--out", out, "--older-than", f"{older_than}"]
    arguments += ["--partitions", str(partitions), *(["--keep"] if keep else [])]
    _launch(arguments, url=session.url, **shared)


@pipeline.command()
@click.option("--from", "source", required=True, metavar="ROOT", help="An export root.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Report folder.")
@json_option("Print the summary as JSON.")
@_launch_options
def report(source: str, out: str, **shared: Any) -> None:
    """Throughput, latency percentiles, attempts, DLQ rate and top failure reasons from an
    export, as CSV, JSON and a self-contained HTML page with charts."""
    _launch(["report", "--source", source, "--out", out], **shared)
