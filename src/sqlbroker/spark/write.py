"""``df.write.format("sqlbroker")``: publish rows as messages, idempotent under retries.

Each task stages its rows tagged by job, partition and task attempt; the driver's commit
publishes the winning attempt of every partition in one transaction, with deterministic
idempotency keys, and deletes the job's staged rows; an abort deletes them. So a retried
task, a speculative duplicate or a whole re-run of the job publishes each row once.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    NumericType,
    StringType,
    StructType,
)

from sqlbroker.client.base import DEFAULT_DEDUPE_WINDOW, DEFAULT_MAX_ATTEMPTS
from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption, InvalidPayload
from sqlbroker.core.message import NORMAL
from sqlbroker.core.serde import encode_payload
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.publishing import PublishDefaults
from sqlbroker.spark import options as opt

if TYPE_CHECKING:
    import pyarrow as pa

STAGE_CHUNK = 5_000
PUBLISH_CHUNK = 5_000
PUBLISH_CONNECTIONS = 2
_TOPIC_CACHE = 4096  # validated topics a task remembers (a topic column's distinct values)
_ARROW_TYPES = (BinaryType, BooleanType, NumericType, StringType)
"""Column types whose Python values are the same from an Arrow batch as from a ``Row``
(every number but a decimal)."""
STALE_STAGE = timedelta(days=7)
_COLUMN_OPTIONS = (
    "topic_column",
    "key_column",
    "priority_column",
    "idempotency_key_column",
    "payload_column",
)


@dataclass
class StagedPartition(WriterCommitMessage):
    """What one successful task attempt staged."""

    partition: int
    attempt: int
    rows: int


class StagedRow(NamedTuple):
    """A validated row as a task stages it: what ``build_message`` checks and encodes,
    without the message id (the publish makes those). A ``StageRow`` of the stores."""

    topic: str
    payload: bytes
    content_type: str
    headers: str | None
    priority: int
    ordering_key: str | None
    idempotency_key: str | None
    max_attempts: int
    dedupe_window: float


def jsonable(value: Any) -> Any:
    """A Spark value as plain JSON: times as ISO 8601, decimals as strings, bytes as base64."""
    kind = type(value)
    if kind is int or kind is str or kind is bool or value is None:
        return value
    if isinstance(value, Row):
        return {k: jsonable(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and value != value:
        return None
    return value


class MessageWriter(DataSourceWriter):
    """Publishes a DataFrame's rows as messages (see the module docstring)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.connection = opt.Connection.of(options)
        self.topic = opt.text(options, "topic")
        if self.topic is not None:
            validate_topic(self.topic, "topic")
        self.columns = {name: opt.text(options, name) for name in _COLUMN_OPTIONS}
        names = set(schema.fieldNames())
        for option, column in self.columns.items():
            if column is not None and column not in names:
                raise InvalidOption(option, f"names no column of the DataFrame: {column!r}")
        if self.topic is None and self.columns["topic_column"] is None:
            raise InvalidOption("topic", "give topic or topic_column")
        payload_column = self.columns["payload_column"]
        payload_type = None if payload_column is None else schema[payload_column].dataType
        self.binary_payload = isinstance(payload_type, BinaryType)
        self.text_payload = isinstance(payload_type, StringType)
        self.content_type = opt.text(options, "content_type")
        self.defaults = PublishDefaults(
            max_attempts=opt.integer(
                options, "max_attempts", DEFAULT_MAX_ATTEMPTS, minimum=1, maximum=1000
            ),
            dedupe_window=opt.number(
                options,
                "dedupe_window",
                DEFAULT_DEDUPE_WINDOW,
                minimum=1.0,
                maximum=366 * 86400.0,
            ),
            payload_limit=opt.integer(
                options, "payload_limit", 256 * 1024, minimum=1, maximum=1024 * 1024
            ),
        )
        self.stage_batch = opt.integer(
            options, "stage_batch", STAGE_CHUNK, minimum=1, maximum=100_000
        )
        self.publish_chunk = opt.integer(
            options, "publish_chunk", PUBLISH_CHUNK, minimum=1, maximum=100_000
        )
        self.publish_connections = opt.integer(
            options, "publish_connections", PUBLISH_CONNECTIONS, minimum=1, maximum=16
        )
        self.key_prefix = "spark:" + (opt.text(options, "write_id") or "") + ":"
        self.job = uuid.uuid4().hex
        self.excluded = {c for c in self.columns.values() if c is not None}
        self.names = schema.fieldNames()
        self._topics: set[str] = set()
        # Last: the options are all valid before the database is opened.
        self.connection = self.connection.bind()

    # --- on the executors --------------------------------------------------------------------

    def _topic(self, value: object) -> str:
        if type(value) is str and value in self._topics:
            return value
        topic = validate_topic(value, "topic")
        if len(self._topics) < _TOPIC_CACHE:
            self._topics.add(topic)
        return topic

    def _staged(self, values: dict[str, Any]) -> StagedRow:
        """One row validated as ``Broker.publish`` validates a message (``build_message``'s
        checks, in its order: topic, payload, key, idempotency key, priority)."""
        column = self.columns
        topic = (
            self._topic(values[column["topic_column"]]) if column["topic_column"] else self.topic
        )
        assert topic is not None  # the options give topic or topic_column
        if column["payload_column"]:
            raw = values[column["payload_column"]]
            if self.text_payload and raw is not None:
                try:
                    payload: Any = json.loads(raw)
                except ValueError:
                    raise InvalidPayload(
                        "payload_column", f"column {column['payload_column']!r} holds no JSON"
                    ) from None
            elif self.binary_payload and raw is not None:
                payload = bytes(raw)
            else:
                payload = jsonable(raw)
        else:
            payload = {k: jsonable(v) for k, v in values.items() if k not in self.excluded}
        data, kind = encode_payload(
            payload,
            content_type=self.content_type if self.binary_payload else None,
            limit=self.defaults.payload_limit,
            field="payload",
        )
        key = validate.key(values[column["key_column"]], "key") if column["key_column"] else None
        idempotency_key = (
            validate.key(values[column["idempotency_key_column"]], "idempotency_key")
            if column["idempotency_key_column"]
            else None
        )
        priority = values[column["priority_column"]] if column["priority_column"] else None
        return StagedRow(
            topic=topic,
            payload=data,
            content_type=kind,
            headers=None,
            priority=validate.priority(NORMAL if priority is None else priority, "priority"),
            ordering_key=key,
            idempotency_key=idempotency_key,
            max_attempts=self.defaults.max_attempts,
            dedupe_window=self.defaults.dedupe_window,
        )

    def write(self, iterator: Iterator[Row]) -> StagedPartition:
        return self.stage(row.asDict(recursive=False) for row in iterator)

    def stage(self, rows: Iterator[dict[str, Any]]) -> StagedPartition:
        """Validate and stage a task's rows (column name -> value) under its attempt."""
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.taskAttemptId() if context else 0
        rows, staged = iter(rows), 0
        with self.connection.session() as (_, store):
            while chunk := [self._staged(row) for row in islice(rows, self.stage_batch)]:
                staged += store.stage_insert(
                    job=self.job, partition=partition, attempt=attempt, first_seq=staged, rows=chunk
                )
        return StagedPartition(partition=partition, attempt=attempt, rows=staged)

    # --- on the driver -----------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        winners = sorted(
            {(m.partition, m.attempt) for m in messages if isinstance(m, StagedPartition)}
        )
        with self.connection.session() as (broker, store):
            store.stage_publish(
                job=self.job,
                winners=winners,
                key_prefix=self.key_prefix,
                chunk=self.publish_chunk,
                # Ordering keys keep the order of the partitions: one connection.
                connections=1 if self.columns["key_column"] else self.publish_connections,
            )
            # Jobs whose driver died between staging and commit leave rows behind.
            store.stage_discard(job=None, older_than=broker.backend.now() - STALE_STAGE)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.connection.session() as (_, store):
            store.stage_discard(job=self.job, older_than=None)


class MessageArrowWriter(MessageWriter, DataSourceArrowWriter):
    """:class:`MessageWriter` for a DataFrame whose columns are all numbers, booleans,
    strings or binary: the tasks take Spark's Arrow batches as they come, a column at a
    time, instead of a ``Row`` object per row (the same values, validated the same way)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPartition:
        def rows() -> Iterator[dict[str, Any]]:
            for batch in iterator:
                columns = [column.to_pylist() for column in batch.columns]
                for values in zip(*columns, strict=True):
                    yield dict(zip(self.names, values, strict=True))

        return self.stage(rows())


def message_writer(options: dict[str, str], schema: StructType) -> DataSourceWriter:
    """The writer of ``df.write.format("sqlbroker")`` for a DataFrame of ``schema``."""
    arrow = bool(schema.fields) and all(
        isinstance(field.dataType, _ARROW_TYPES) and not isinstance(field.dataType, DecimalType)
        for field in schema.fields
    )
    return (MessageArrowWriter if arrow else MessageWriter)(options, schema)
