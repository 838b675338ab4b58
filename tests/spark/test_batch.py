"""Batch reads and idempotent batch writes through ``format("sqlbroker")``, on both backends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from sqlbroker.spark.storage import open_store

pytestmark = pytest.mark.spark


def _orders(spark: Any, count: int, partitions: int = 3) -> Any:
    return spark.range(0, count, 1, partitions).selectExpr(
        "id AS order_id",
        "concat('customer-', CAST(id % 7 AS STRING)) AS customer",
        "CAST(id * 1.5 AS DOUBLE) AS amount",
    )


def _write(df: Any, url: str, **options: str) -> None:
    writer = df.write.format("sqlbroker").option("url", url).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def _staged_rows_left(broker: sqlbroker.Broker) -> int:
    store = open_store(broker, url=broker.url, options={})
    return store.stage_discard(job=None, older_than=broker.backend.now())


def _payloads(broker: sqlbroker.Broker, subscription: str) -> list[Any]:
    found = []
    while True:
        claimed = broker.claim(subscription, limit=500)
        if not claimed:
            return found
        found.extend(d.payload for d in claimed)
        broker.complete(claimed)


def test_write_publishes_each_row_as_a_json_message(spark: Any, broker: sqlbroker.Broker) -> None:
    broker.subscribe("billing", "orders.*")
    _write(_orders(spark, 120), broker.url, topic="orders.created", key_column="customer")

    pending = broker.pending("billing", limit=1000)
    assert len(pending) == 120
    assert {p.key for p in pending} == {f"customer-{n}" for n in range(7)}
    payloads = _payloads(broker, "billing")
    assert sorted(p["order_id"] for p in payloads) == list(range(120))
    # The key column is the ordering key, not part of the payload.
    assert all(set(p) == {"order_id", "amount"} for p in payloads)


def test_topic_priority_payload_and_idempotency_columns(
    spark: Any, broker: sqlbroker.Broker
) -> None:
    broker.subscribe("everything", "#")
    df = spark.createDataFrame(
        [
            ("a.one", 0, '{"n": 1}', "k1"),
            ("b.two", 5, '{"n": 2}', "k2"),
            ("b.two", 5, '{"n": 2}', "k2"),
        ],
        "t STRING, p INT, body STRING, idem STRING",
    )
    _write(
        df,
        broker.url,
        topic_column="t",
        priority_column="p",
        payload_column="body",
        idempotency_key_column="idem",
    )
    pending = broker.pending("everything", limit=10)
    assert sorted((p.topic, p.priority) for p in pending) == [("a.one", 0), ("b.two", 5)]
    assert sorted(d["n"] for d in _payloads(broker, "everything")) == [1, 2]


def test_identical_rows_stay_distinct_and_a_rerun_adds_none(
    spark: Any, broker: sqlbroker.Broker
) -> None:
    broker.subscribe("audit", "audit.#")
    df = spark.createDataFrame([("same",)] * 5 + [("other",)] * 3, "word STRING").repartition(2)
    _write(df, broker.url, topic="audit.words")
    assert len(broker.pending("audit", limit=100)) == 8
    _write(df, broker.url, topic="audit.words")
    assert len(broker.pending("audit", limit=100)) == 8
    # A new write_id names a new job: the same rows are published again.
    _write(df, broker.url, topic="audit.words", write_id="second-run")
    assert len(broker.pending("audit", limit=100)) == 16


def test_task_failures_are_retried_and_publish_exactly_once(
    spark: Any, broker: sqlbroker.Broker, tmp_path: Path
) -> None:
    """The first attempt of one partition dies after staging some rows; Spark retries it.
    The driver publishes the winning attempts only: exactly N messages, and a re-run of the
    whole job adds none."""
    from pyspark.sql.functions import udf

    broker.subscribe("orders", "orders.#")
    marker = str(tmp_path / "failed-once")

    def fail_once(value: int) -> int:
        import os

        from pyspark import TaskContext

        context = TaskContext.get()
        if value == 170 and context is not None and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected task failure")
        return value

    df = _orders(spark, 300, partitions=3).withColumn(
        "order_id", udf(fail_once, "long", useArrow=False)("order_id")
    )
    previous = {
        name: spark.conf.get(name)
        for name in (
            "spark.sql.execution.arrow.maxRecordsPerBatch",
            "spark.sql.execution.python.udf.maxRecordsPerBatch",
        )
    }
    try:
        for name in previous:
            spark.conf.set(name, "10")
        _write(df, broker.url, topic="orders.created", stage_batch="10")
        assert Path(marker).exists()
        assert len(broker.pending("orders", limit=1000)) == 300
        _write(df, broker.url, topic="orders.created", stage_batch="10")
    finally:
        for name, value in previous.items():
            spark.conf.set(name, value)
    payloads = _payloads(broker, "orders")
    assert sorted(p["order_id"] for p in payloads) == list(range(300))
    assert _staged_rows_left(broker) == 0


@pytest.fixture
def sqlite_broker(tmp_path: Path) -> Any:
    """For the tests of Spark-side logic, which is the same whatever the backend."""
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/spark.db") as opened:
        yield opened


def test_a_failed_job_publishes_nothing_and_leaves_no_staged_rows(
    spark: Any, sqlite_broker: sqlbroker.Broker
) -> None:
    broker = sqlite_broker
    from pyspark.sql.functions import udf

    broker.subscribe("orders", "orders.#")

    def always_fail(value: int) -> int:
        if value == 250:
            raise RuntimeError("this partition never succeeds")
        return value

    df = _orders(spark, 300, partitions=3).withColumn(
        "order_id", udf(always_fail, "long", useArrow=False)("order_id")
    )
    with pytest.raises(Exception, match="this partition never succeeds"):
        _write(df, broker.url, topic="orders.created", stage_batch="10")
    assert broker.pending("orders") == []
    assert _staged_rows_left(broker) == 0


def test_bad_options_fail_before_anything_runs(spark: Any, sqlite_broker: sqlbroker.Broker) -> None:
    broker = sqlite_broker
    df = _orders(spark, 3)
    with pytest.raises(Exception, match="topic"):
        _write(df, broker.url)
    with pytest.raises(Exception, match="key_column"):
        _write(df, broker.url, topic="orders.created", key_column="nope")
    with pytest.raises(Exception, match=r"must be a valid|topic"):
        _write(df, broker.url, topic="bad topic!")


def test_a_bad_id_bound_fails_at_load_before_the_database_is_opened(tmp_path: Path) -> None:
    from sqlbroker.core.errors import InvalidOption
    from sqlbroker.spark.source import SqlbrokerDataSource

    url = f"sqlite:///{tmp_path}/never.db"
    for option, value in (("min_id", "first"), ("max_id", "-1")):
        with pytest.raises(InvalidOption, match=option):
            SqlbrokerDataSource({"url": url, option: value})
    assert not (tmp_path / "never.db").exists()


def test_a_row_with_an_invalid_value_fails_the_job_with_a_clear_error(
    spark: Any, sqlite_broker: sqlbroker.Broker
) -> None:
    broker = sqlite_broker
    broker.subscribe("everything", "#")
    df = spark.createDataFrame([("ok", 1), ("ok", 42)], "word STRING, p INT")
    with pytest.raises(Exception, match="priority"):
        _write(df, broker.url, topic="words", priority_column="p")
    assert broker.pending("everything") == []


def test_arrow_batches_and_rows_give_the_same_messages(
    spark: Any, sqlite_broker: sqlbroker.Broker
) -> None:
    """Issue 28 item 5: a DataFrame of numbers, booleans, strings and binary reaches the
    tasks as Arrow batches (no ``Row`` per row); any other column type as ``Row``s. Both
    make the same JSON payloads (NaN as null, binary as base64, keys and priorities from
    their columns) and refuse the same bad values."""
    from pyspark.sql.types import StructType

    from sqlbroker.spark.write import MessageArrowWriter, MessageWriter, message_writer

    broker = sqlite_broker
    broker.subscribe("simple", "simple.#")
    broker.subscribe("mixed", "mixed.#")
    simple = spark.createDataFrame(
        [
            (1, 10, 0.5, float("nan"), "zürich ✓", True, bytearray(b"\x00\xff"), "k1", 1),
            (2, -(2**40), -1.25, 1e300, "", False, None, None, None),
            (3, None, None, None, None, None, bytearray(b""), "k1", 9),
        ],
        "i INT, l BIGINT, f FLOAT, d DOUBLE, s STRING, b BOOLEAN, bin BINARY, key STRING, p INT",
    )
    mixed = simple.selectExpr("*", "TIMESTAMP '2024-05-01 12:00:00' AS at")
    options = {"url": broker.url, "key_column": "key", "priority_column": "p"}
    chosen = {
        name: message_writer({**options, "topic": f"{name}.rows"}, frame.schema)
        for name, frame in (("simple", simple), ("mixed", mixed))
    }
    assert isinstance(chosen["simple"], MessageArrowWriter)
    assert type(chosen["mixed"]) is MessageWriter
    empty = message_writer({"url": broker.url, "topic": "t"}, StructType())
    assert type(empty) is MessageWriter

    _write(simple, broker.url, topic="simple.rows", key_column="key", priority_column="p")
    _write(mixed, broker.url, topic="mixed.rows", key_column="key", priority_column="p")
    found = {}
    for name in ("simple", "mixed"):
        pending = broker.pending(name, limit=10)
        found[name] = (
            sorted(((m.key, m.priority) for m in pending), key=str),
            sorted(_payloads(broker, name), key=lambda p: p["i"]),
        )
    assert found["simple"][0] == found["mixed"][0]
    assert found["simple"][0] == sorted([("k1", 1), ("k1", 9), (None, 2)], key=str)
    assert [{k: v for k, v in p.items() if k != "at"} for p in found["mixed"][1]] == found[
        "simple"
    ][1]
    first = found["simple"][1][0]
    assert first == {
        "i": 1,
        "l": 10,
        "f": 0.5,
        "d": None,
        "s": "zürich ✓",
        "b": True,
        "bin": "AP8=",
    }
    assert found["mixed"][1][0]["at"].startswith("2024-05-01T12:00")

    bad = spark.createDataFrame([(1, float("inf"))], "i INT, d DOUBLE")
    for frame in (bad, bad.selectExpr("*", "CURRENT_DATE() AS day")):
        with pytest.raises(Exception, match="payload"):
            _write(frame, broker.url, topic="simple.bad")
    assert broker.pending("simple") == []


def test_read_tables_with_filters(spark: Any, broker: sqlbroker.Broker) -> None:
    broker.subscribe("alpha", "a.#")
    broker.subscribe("beta", "b.#")
    broker.publish_many(
        [{"topic": "a.x", "payload": {"n": n}} for n in range(30)]
        + [{"topic": "b.y", "payload": {"n": n}} for n in range(20)]
    )
    claimed = broker.claim("alpha", limit=10)
    broker.complete(claimed[:7])
    for delivery in claimed[7:]:
        broker.dead_letter(delivery, reason="bad order")

    def read(**options: str) -> Any:
        reader = spark.read.format("sqlbroker").option("url", broker.url)
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    messages = read(partitions="3", fetch_size="7")
    assert messages.count() == 40
    assert read(subscription="beta").count() == 20
    assert read(topic="a.*").count() == 20
    assert read(topic="#", subscription="alpha").count() == 20
    archive = read(table="archive")
    assert archive.count() == 7
    assert {row.outcome for row in archive.select("outcome").collect()} == {"completed"}
    dead = read(table="dead").collect()
    assert [row.reason for row in dead] == ["bad order"] * 3
    rows = read(subscription="beta", partitions="4").orderBy("id").collect()
    assert [json.loads(bytes(row.payload))["n"] for row in rows] == list(range(20))
    assert read(until="2000-01-01T00:00:00Z").count() == 0
    assert read(since="2000-01-01T00:00:00Z").count() == 40
    empty = sqlbroker.Broker(broker.url)
    empty.close()
    assert read(subscription="nobody").count() == 0
    with pytest.raises(Exception, match="table"):
        read(table="secrets").count()


def test_both_backends_read_the_same_rows(spark: Any, pg_url: str, tmp_path: Path) -> None:
    """One column list, two stores: the same history reads back alike (PostgreSQL through
    ADBC, SQLite through its driver), apart from what each database assigns."""

    def history(url: str) -> None:
        with sqlbroker.Broker(url, migrate=True) as broker:
            broker.subscribe("alpha", "a.#")
            broker.publish_many(
                [{"topic": "a.x", "payload": {"n": n}, "headers": {"h": str(n)}} for n in range(25)]
            )
            claimed = broker.claim("alpha", limit=10)
            broker.complete(claimed[:6])
            for delivery in claimed[6:]:
                broker.dead_letter(delivery, reason="nope", error=ValueError("bad"))

    def rows(url: str, table: str) -> list[dict[str, Any]]:
        frame = (
            spark.read.format("sqlbroker")
            .option("url", url)
            .option("table", table)
            .option("topic", "a.*")
            .option("partitions", "3")
            .load()
        )
        found = []
        for row in sorted(frame.collect(), key=lambda row: row.id):
            values = row.asDict()
            assert values["enqueued_at"] is not None
            assert values["message_id"]
            found.append(
                {
                    name: value
                    for name, value in values.items()
                    if not name.endswith(("id", "_at", "traceback"))
                }
            )
        return found

    sqlite_url = f"sqlite:///{tmp_path}/same.db"
    history(sqlite_url)
    history(pg_url)
    for table, count in (("messages", 15), ("archive", 6), ("dead", 4)):
        through_sqlite = rows(sqlite_url, table)
        assert len(through_sqlite) == count
        assert rows(pg_url, table) == through_sqlite
