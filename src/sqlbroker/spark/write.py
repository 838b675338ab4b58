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
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from sqlbroker.client.base import DEFAULT_DEDUPE_WINDOW, DEFAULT_MAX_ATTEMPTS
from sqlbroker.core.errors import InvalidOption, InvalidPayload
from sqlbroker.core.message import NORMAL, NewMessage
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.publishing import PublishDefaults, build_message
from sqlbroker.spark import options as opt

STAGE_CHUNK = 5_000
PUBLISH_CHUNK = 5_000
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


def jsonable(value: Any) -> Any:
    """A Spark value as plain JSON: times as ISO 8601, decimals as strings, bytes as base64."""
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
        self.binary_payload = payload_column is not None and isinstance(
            schema[payload_column].dataType, BinaryType
        )
        self.text_payload = payload_column is not None and isinstance(
            schema[payload_column].dataType, StringType
        )
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
        self.key_prefix = "spark:" + (opt.text(options, "write_id") or "") + ":"
        self.job = uuid.uuid4().hex
        self.excluded = {c for c in self.columns.values() if c is not None}
        # Last: the options are all valid before the database is opened.
        self.connection = self.connection.bind()

    # --- on the executors --------------------------------------------------------------------

    def _message(self, row: Row) -> NewMessage:
        values = row.asDict(recursive=False)
        column = self.columns
        topic = values[column["topic_column"]] if column["topic_column"] else self.topic
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
        priority = values[column["priority_column"]] if column["priority_column"] else None
        return build_message(
            topic,
            payload,
            defaults=self.defaults,
            key=values[column["key_column"]] if column["key_column"] else None,
            priority=NORMAL if priority is None else priority,
            idempotency_key=(
                values[column["idempotency_key_column"]]
                if column["idempotency_key_column"]
                else None
            ),
            content_type=self.content_type if self.binary_payload else None,
        )

    def write(self, iterator: Iterator[Row]) -> StagedPartition:
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.taskAttemptId() if context else 0
        broker, store = self.connection.open()
        staged = 0
        try:
            chunk: list[NewMessage] = []
            for row in iterator:
                chunk.append(self._message(row))
                if len(chunk) >= self.stage_batch:
                    staged += store.stage_insert(
                        job=self.job,
                        partition=partition,
                        attempt=attempt,
                        first_seq=staged,
                        rows=chunk,
                    )
                    chunk = []
            if chunk:
                staged += store.stage_insert(
                    job=self.job, partition=partition, attempt=attempt, first_seq=staged, rows=chunk
                )
        finally:
            broker.close()
        return StagedPartition(partition=partition, attempt=attempt, rows=staged)

    # --- on the driver -----------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        winners = sorted(
            {(m.partition, m.attempt) for m in messages if isinstance(m, StagedPartition)}
        )
        broker, store = self.connection.open()
        try:
            store.stage_publish(
                job=self.job,
                winners=winners,
                key_prefix=self.key_prefix,
                chunk=self.publish_chunk,
            )
            # Jobs whose driver died between staging and commit leave rows behind.
            store.stage_discard(job=None, older_than=broker.backend.now() - STALE_STAGE)
        finally:
            broker.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        broker, store = self.connection.open()
        try:
            store.stage_discard(job=self.job, older_than=None)
        finally:
            broker.close()
