"""The data source and the archive pipeline on a real standalone cluster: a master and two
workers in JVMs of their own, jobs submitted with ``spark-submit --master spark://…``.

Executors run in directories of their own, with none of the driver's environment: a path
or a setting that resolves differently there must never make them write to, or read from,
another database than the driver's. Either they reach the same database, or the job fails
loudly and nothing is published or acknowledged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from helpers import table_counts

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

APP = Path(__file__).with_name("clusterapp.py")
EXECUTORS_DATABASE = "sqlbroker_cluster_executors"
"""libpq's default database on the cluster's hosts (``PGDATABASE`` of the workers)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from spark.cluster import StandaloneCluster

    started = StandaloneCluster(
        tmp_path_factory.mktemp("spark-cluster"),
        worker_environment={"PGDATABASE": EXECUTORS_DATABASE},
    ).start()
    try:
        yield started
    finally:
        started.stop()


def _submit(
    cluster: Any, *arguments: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.submit_command(str(APP), *arguments),
        cwd=cwd,
        env={**cluster.submit_environment(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _error(done: subprocess.CompletedProcess[str]) -> str:
    """What the job printed after ``error:`` (spark-submit passes the Python driver's
    stderr on to its stdout)."""
    found = re.findall(r"^error: (?:.|\n)*", done.stdout, re.MULTILINE)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    return str(found[-1])


def _sink_rows(sink: Path) -> list[dict[str, Any]]:
    """The rows of the files the sink committed (a failed task may leave others)."""
    import pyarrow.parquet as pq

    committed = []
    for log in sorted((sink / "_spark_metadata").glob("[0-9]*")):
        for line in log.read_text().splitlines()[1:]:
            committed.append(json.loads(line)["path"].removeprefix("file://"))
    return [row for f in committed for row in pq.read_table(f).select(["message_id"]).to_pylist()]


def test_a_write_with_a_relative_sqlite_path_publishes_into_the_drivers_file(
    cluster: Any, tmp_path: Path
) -> None:
    """The executors run in the workers' directories: the driver resolves the path."""
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/app.db") as broker:
        broker.subscribe("orders", "orders.#")
        done = _submit(cluster, "write", "sqlite:///app.db", "3000", "orders.created", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert len(broker.pending("orders", limit=5000)) == 3000
    assert not list((cluster.home).rglob("app.db")), "an executor created a database"


def test_a_stream_with_a_relative_sqlite_path_delivers_what_it_acknowledges(
    cluster: Any, tmp_path: Path
) -> None:
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/app.db") as broker:
        broker.subscribe("orders", "orders.#")
        published = broker.publish_many(
            [{"topic": "orders.created", "payload": {"n": n}} for n in range(3000)]
        )
        sink = tmp_path / "sink"
        done = _submit(cluster, "stream", "sqlite:///app.db", "orders", str(sink), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        delivered = {row["message_id"] for row in _sink_rows(sink)}
        completed = broker.archive("orders", outcome="completed", limit=5000)
        assert delivered == set(published)
        assert {c.message_id for c in completed} <= delivered
    assert not list((cluster.home).rglob("app.db")), "an executor created a database"


@pytest.mark.postgres
def test_executors_reaching_another_postgresql_database_fail_before_writing(
    cluster: Any, pg_server: Any, pg_url: str, tmp_path: Path
) -> None:
    """The URL names no database: libpq takes it from ``PGDATABASE``, which differs on the
    cluster's hosts. The write and the stream fail with sqlbroker's error; neither
    database gets a message, and the stream acknowledges nothing."""
    pg_server.create_database(EXECUTORS_DATABASE, "sqlbroker_template")
    try:
        bare, drivers_database = pg_url.rsplit("/", 1)
        other_url = f"{bare}/{EXECUTORS_DATABASE}"
        with sqlbroker.Broker(pg_url) as broker, sqlbroker.Broker(other_url) as elsewhere:
            for opened in (broker, elsewhere):
                opened.subscribe("orders", "orders.#")
            published = broker.publish_many(
                [{"topic": "orders.created", "payload": {"n": n}} for n in range(50)]
            )
            env = {"PGDATABASE": drivers_database}
            written = _submit(
                cluster, "write", f"{bare}/", "500", "orders.created", cwd=tmp_path, env=env
            )
            assert written.returncode == 1
            assert "is not the database of the driver" in _error(written)
            sink = tmp_path / "sink"
            streamed = _submit(
                cluster, "stream", f"{bare}/", "orders", str(sink), cwd=tmp_path, env=env
            )
            assert streamed.returncode == 1
            assert "is not the database of the driver" in _error(streamed)
            assert _sink_rows(sink) == []
            assert broker.archive("orders", limit=10) == []
            assert elsewhere.pending("orders") == []
            assert elsewhere.archive("orders", limit=10) == []
            # Nothing was acknowledged: all 50 are still in the queue, claimed by the stream
            # until their lease lapses.
            assert len(broker.pending("orders", limit=100)) == len(published)
    finally:
        pg_server.drop_database(EXECUTORS_DATABASE)


def test_the_pipeline_runs_on_the_cluster_it_is_given(cluster: Any, tmp_path: Path) -> None:
    """``sqlbroker pipeline export --master spark://…``, then ``report`` with the master
    named by ``PYSPARK_SUBMIT_ARGS`` only: both run on the cluster, not on ``local[*]``;
    the export leaves no staging directory behind."""
    url = f"sqlite:///{tmp_path}/app.db"
    with sqlbroker.Broker(url) as broker:
        broker.subscribe("billing", "orders.#")
        broker.publish_many([{"topic": "orders.created", "payload": {"n": n}} for n in range(200)])
        broker.complete(broker.claim("billing", limit=200))
    root, folder = tmp_path / "export", tmp_path / "report"
    # The settings spark-submit would get; all but the first two start with --conf.
    settings = cluster.submit_command()[3:]
    env = cluster.submit_environment()
    env["PYSPARK_SUBMIT_ARGS"] = " ".join([*settings, "pyspark-shell"])
    registered = (cluster.home / "master.log").read_text().count("Registering app")
    command = [str(Path(sys.executable).with_name("sqlbroker")), "--url", "sqlite:///app.db"]
    export_arguments = ["--out", str(root), "--older-than", "0s", "--quiet", "--json"]
    exported = subprocess.run(
        [*command, "pipeline", "export", "--master", cluster.master_url, *export_arguments],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads(exported.stdout)["export"]["archive_rows"] == 200
    with sqlbroker.Broker(url) as broker:
        assert broker.archive(limit=10) == []
    assert not (root / "_staging").exists()

    env["PYSPARK_SUBMIT_ARGS"] = " ".join(
        ["--master", cluster.master_url, *settings, "pyspark-shell"]
    )
    reported = subprocess.run(
        [*command, "pipeline", "report", "--from", str(root), "--out", str(folder), "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert (folder / "report.html").exists()
    assert (cluster.home / "master.log").read_text().count("Registering app") == registered + 2


def _executors(cluster: Any) -> list[int]:
    """The process ids of the cluster's executor JVMs (they run below its workers' dirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in command and cwd.startswith(str(cluster.home)):
            found.append(int(entry.name))
    return found


def _launch(cluster: Any, *arguments: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cluster.submit_command(str(APP), *arguments),
        cwd=cwd,
        env=cluster.submit_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_until(condition: Any, process: subprocess.Popen[str], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.2)


def _kill_an_executor(cluster: Any, process: subprocess.Popen[str]) -> None:
    _wait_until(lambda: bool(_executors(cluster)), process)
    os.kill(_executors(cluster)[0], signal.SIGKILL)


def test_a_write_whose_executor_is_killed_publishes_each_row_once(
    cluster: Any, tmp_path: Path
) -> None:
    """Issue 28 item 3: an executor SIGKILLed while its tasks stage rows; Spark runs them
    again on a new executor, and the commit publishes every row exactly once."""
    url = f"sqlite:///{tmp_path}/app.db"
    with sqlbroker.Broker(url) as broker:
        broker.subscribe("orders", "orders.#")

        def staging() -> bool:
            counts = table_counts(broker.backend)
            return bool(counts.get("sqlbroker_spark_stage"))

        job = _launch(cluster, "write", url, "40000", "orders.created", cwd=tmp_path)
        _wait_until(staging, job)
        _kill_an_executor(cluster, job)
        output, _ = job.communicate(timeout=600)
        assert job.returncode == 0, output[-3000:]
        counts = table_counts(broker.backend)
        assert counts.get("sqlbroker_message") == 40000
        assert not counts.get("sqlbroker_spark_stage")


def test_a_stream_whose_executor_then_driver_are_killed_loses_nothing(
    cluster: Any, tmp_path: Path
) -> None:
    """Issue 28 item 3: an executor, then the driver, SIGKILLed while a stream drains a
    backlog; restarted from its checkpoint, the query delivers every message to the sink,
    and none twice (a batch replayed after the restart reads the same snapshot, and the
    Parquet sink commits a batch once); every message acknowledged is in the sink."""
    url = f"sqlite:///{tmp_path}/app.db"
    sink, checkpoint = tmp_path / "sink", str(tmp_path / "checkpoint")
    with sqlbroker.Broker(url) as broker:
        broker.subscribe("orders", "orders.#")
        published = broker.publish_many(
            [{"topic": "orders.created", "payload": {"n": n}} for n in range(8000)]
        )

        def acked(at_least: int) -> Any:
            return lambda: table_counts(broker.backend).get("sqlbroker_archive", 0) >= at_least

        job = _launch(cluster, "stream", url, "orders", str(sink), checkpoint, "1000", cwd=tmp_path)
        _wait_until(acked(1000), job)
        _kill_an_executor(cluster, job)
        _wait_until(acked(3000), job)
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        assert table_counts(broker.backend).get("sqlbroker_message", 0) > 0, "drained already"

        done = _submit(
            cluster, "stream", url, "orders", str(sink), checkpoint, "1000", cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout[-3000:]
        delivered = [row["message_id"] for row in _sink_rows(sink)]
        completed = broker.archive("orders", outcome="completed", limit=10000)
        assert sorted(delivered) == sorted(published)
        assert {c.message_id for c in completed} == set(published)
