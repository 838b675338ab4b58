"""Streaming a subscription into a Parquet sink: acks, idle acks, workers beside the stream,
and a query killed and restarted from its checkpoint losing nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from sqlbroker.spark.schema import TABLE_SCHEMAS

pytestmark = pytest.mark.spark

WAIT = 120.0


def _until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.25)


def _sink_ids(spark: Any, sink: Path) -> list[str]:
    if not (sink / "_spark_metadata").exists():
        return []
    rows = spark.read.schema(TABLE_SCHEMAS["messages"]).parquet(str(sink))
    return [row.message_id for row in rows.select("message_id").collect()]


def _start(spark: Any, url: str, subscription: str, sink: Path, checkpoint: Path) -> Any:
    stream = (
        spark.readStream.format("sqlbroker")
        .option("url", url)
        .option("subscription", subscription)
        .option("max_batch", "25")
        .load()
    )
    return (
        stream.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def test_stream_into_parquet_acks_every_batch_even_when_idle(
    spark: Any, broker: sqlbroker.Broker, tmp_path: Path
) -> None:
    broker.subscribe("events", "events.#")
    published = broker.publish_many(
        [{"topic": "events.created", "payload": {"n": n}} for n in range(60)]
    )
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    query = _start(spark, broker.url, "events", sink, checkpoint)
    try:
        _until(lambda: len(_sink_ids(spark, sink)) >= 60, "the first 60 messages")
        published += broker.publish_many(
            [{"topic": "events.updated", "payload": {"n": n}} for n in range(60, 90)]
        )
        _until(lambda: len(_sink_ids(spark, sink)) >= 90, "all 90 messages")
        # The queue is idle now: the last batch is acknowledged without a next batch.
        _until(lambda: not broker.pending("events"), "the last batch's ack")
    finally:
        query.stop()
    ids = _sink_ids(spark, sink)
    assert sorted(ids) == sorted(published)
    rows = spark.read.schema(TABLE_SCHEMAS["messages"]).parquet(str(sink)).collect()
    assert {row.subscription for row in rows} == {"events"}
    assert {row.state for row in rows} == {"running"}
    assert len(broker.archive("events", outcome="completed", limit=1000)) == 90


def test_stream_runs_beside_ordinary_workers(
    spark: Any, broker: sqlbroker.Broker, tmp_path: Path
) -> None:
    broker.subscribe("jobs", "jobs.#")
    worker_done: list[str] = []
    stop = threading.Event()

    def worker() -> None:
        with sqlbroker.Broker(broker.url) as own:
            while not stop.is_set():
                # A slow worker, so that the stream gets its share.
                claimed = own.claim("jobs", limit=2)
                if claimed:
                    own.complete(claimed)
                    worker_done.extend(d.message_id for d in claimed)
                time.sleep(0.1)

    thread = threading.Thread(target=worker)
    thread.start()
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    query = _start(spark, broker.url, "jobs", sink, checkpoint)
    published: list[str] = []
    try:
        _until(lambda: query.lastProgress is not None, "the query's first trigger")
        for start in range(0, 200, 40):
            published += broker.publish_many(
                [{"topic": "jobs.run", "payload": {"n": n}} for n in range(start, start + 40)]
            )
            time.sleep(0.3)
        _until(
            lambda: len(_sink_ids(spark, sink)) + len(worker_done) >= 200,
            "the stream and the worker to take all 200",
        )
        _until(lambda: not broker.pending("jobs"), "every claim acknowledged")
    finally:
        query.stop()
        stop.set()
        thread.join()
    streamed = _sink_ids(spark, sink)
    assert sorted(streamed + worker_done) == sorted(published)
    assert streamed, "the stream took none"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_query_restarted_from_its_checkpoint_loses_nothing(
    spark: Any, backend_url: str, tmp_path: Path
) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("orders", "orders.#")
        published = broker.publish_many(
            [{"topic": "orders.created", "payload": {"n": n}} for n in range(400)]
        )
        sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
        app = Path(__file__).with_name("streamapp.py")
        process = subprocess.Popen(
            [sys.executable, str(app), backend_url, "orders", str(sink), str(checkpoint)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            _until(lambda: len(_sink_ids(spark, sink)) >= 80, "the first batches", timeout=240)
        finally:
            # SIGKILL to the whole group: the Python driver, the JVM and its workers.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        before = len(_sink_ids(spark, sink))
        assert before < 400, "the query finished before it could be killed"

        query = _start(spark, backend_url, "orders", sink, checkpoint)
        try:
            _until(lambda: set(published) <= set(_sink_ids(spark, sink)), "every message")
            _until(lambda: not broker.pending("orders"), "every claim acknowledged")
        finally:
            query.stop()
        streamed = _sink_ids(spark, sink)
        assert set(streamed) == set(published)
        assert len(broker.archive("orders", outcome="completed", limit=1000)) == 400


def test_bad_stream_options_fail_at_load(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/app.db"

    def load(**options: str) -> Any:
        reader = spark.readStream.format("sqlbroker").option("url", url)
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    with pytest.raises(Exception, match=r"max_batch: must be from 1 to 10000000, not 0"):
        load(subscription="orders", max_batch="0")
    with pytest.raises(Exception, match=r"max_batch: must be an integer, not 'many'"):
        load(subscription="orders", max_batch="many")
    with pytest.raises(Exception, match=r"lease: must be from 5 to 86400"):
        load(subscription="orders", lease="1")
    assert load(subscription="orders", max_batch="50000").isStreaming


def test_a_batch_larger_than_a_claim_page(spark: Any, tmp_path: Path) -> None:
    """``max_batch`` has no cap of 1,000: a batch is claimed in pages."""
    sqlite_url = f"sqlite:///{tmp_path}/app.db"
    with sqlbroker.Broker(sqlite_url) as broker:
        broker.subscribe("bulk", "bulk.#")
        published = broker.publish_many(
            [{"topic": "bulk.item", "payload": {"n": n}} for n in range(2600)]
        )
        sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
        query = (
            spark.readStream.format("sqlbroker")
            .option("url", sqlite_url)
            .option("subscription", "bulk")
            .option("max_batch", "2500")
            .load()
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            query.processAllAvailable()
            sizes = [p["numInputRows"] for p in query.recentProgress]
        finally:
            query.stop()
        assert max(sizes) == 2500
        assert sorted(_sink_ids(spark, sink)) == sorted(published)
        assert broker.pending("bulk") == []


def test_the_default_batch_takes_a_backlog_in_large_batches(spark: Any, tmp_path: Path) -> None:
    """Without ``max_batch``, a backlog of 1,500 is one micro-batch (the default was 1,000:
    each micro-batch costs Spark a fixed overhead, issue 28 item 4)."""
    sqlite_url = f"sqlite:///{tmp_path}/app.db"
    with sqlbroker.Broker(sqlite_url) as broker:
        broker.subscribe("bulk", "bulk.#")
        published = broker.publish_many(
            [{"topic": "bulk.item", "payload": {"n": n}} for n in range(1500)]
        )
        sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
        query = (
            spark.readStream.format("sqlbroker")
            .option("url", sqlite_url)
            .option("subscription", "bulk")
            .load()
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            query.processAllAvailable()
            sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()
        assert sizes == [1500]
        assert sorted(_sink_ids(spark, sink)) == sorted(published)
