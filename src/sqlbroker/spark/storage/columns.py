"""The one column list of every Spark read, and what both stores share: staged rows, row
filters and the SQL markers the column list fills in."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from sqlbroker.core.message import NewMessage, new_message_id
from sqlbroker.spark.storage.base import (
    SPARK_TABLES,
    StageRow,
)
from sqlbroker.storage.rows import payload_hash
from sqlbroker.storage.sql import load_sql, parse_blocks

_DELIVERY = (
    "priority",
    "ordering_key",
    "idempotency_key",
    "payload",
    "content_type",
    "headers",
    "attempts",
    "max_attempts",
    "replay_count",
)
"""The columns a message keeps through its life, in the middle of each table's list."""
_FINISHED = ("id", "delivery_id", "message_id", "subscription", "topic")
"""The first columns of the archive and of dead letters."""
SPARK_COLUMNS: dict[str, tuple[str, ...]] = {
    "messages": (
        "id",
        "message_id",
        "subscription",
        "topic",
        "state",
        *_DELIVERY,
        "enqueued_at",
        "available_at",
        "expires_at",
        "first_started_at",
        "lease_expires_at",
        "last_error",
    ),
    "archive": (
        *_FINISHED,
        "outcome",
        *_DELIVERY,
        "enqueued_at",
        "first_started_at",
        "finished_at",
    ),
    "dead": (
        *_FINISHED,
        *_DELIVERY,
        "reason",
        "error_type",
        "error_message",
        "traceback",
        "enqueued_at",
        "first_started_at",
        "first_failed_at",
        "last_failed_at",
        "dead_at",
    ),
}
"""The columns of a Spark batch read of each table, in order: the only list of them. The
SQL of each store names them through markers (:func:`fill_columns`)."""

STREAM_COLUMNS: tuple[str, ...] = SPARK_COLUMNS["messages"]
"""A streaming read yields the columns of a batch read of messages (``id`` is the
delivery id), as they were when claimed."""

SNAPSHOT_COLUMNS: tuple[str, ...] = tuple(c for c in STREAM_COLUMNS if c not in ("id", "state"))
"""The message columns a stream's claim snapshot copies (the claim table stores the id as
``delivery_id`` and no state: a claimed message is running)."""

TIME_COLUMNS = frozenset(
    name for names in SPARK_COLUMNS.values() for name in names if name.endswith("_at")
)
"""The times among the columns: every column named ``*_at``."""


TABLE_SOURCES: dict[str, tuple[str, str]] = {
    "messages": ("sqlbroker_message", "enqueued_at"),
    "archive": ("sqlbroker_archive", "finished_at"),
    "dead": ("sqlbroker_dead", "dead_at"),
}
"""The SQL table of each Spark table, and the time column its ``since``/``until`` bound."""
EXPORTED_TABLES = ("archive", "dead")
"""The tables the archive export moves to Parquet."""
_PER_TABLE = {
    "table_range": SPARK_TABLES,
    "table_read": SPARK_TABLES,
    "table_export_delete": EXPORTED_TABLES,
    "table_export_totals": EXPORTED_TABLES,
}
"""The blocks written once for every table, and the tables each is made for."""


def fill_columns(blocks: Mapping[str, str]) -> dict[str, str]:
    """The blocks of a store's SQL file with their column markers filled in.

    A block ``table_<kind>`` of :data:`_PER_TABLE` becomes ``<table>_<kind>`` for each of
    its tables: ``{table}`` the SQL table, ``{time_column}`` its time column and
    ``{columns}`` the table's column marker.

    ``{messages_columns}``, ``{archive_columns}``, ``{dead_columns}`` and
    ``{stream_columns}`` become the select list of that read; ``{snapshot_columns}`` the
    claim table's copy of a message's columns and ``{snapshot_values}`` the same columns of
    the message row ``m``. A column whose SQL is not its bare name (a cast, a constant) has
    a block of its own: ``column_<name>`` for every read, ``stream_column_<name>`` for the
    stream's read of the claim table. Names come from the lists above, never from input.
    """

    def select(names: Sequence[str], *prefixes: str) -> str:
        def one(name: str) -> str:
            for prefix in prefixes:
                if f"{prefix}{name}" in blocks:
                    return blocks[f"{prefix}{name}"]
            return name

        return ", ".join(one(name) for name in names)

    markers = {
        f"{{{table}_columns}}": select(SPARK_COLUMNS[table], "column_") for table in SPARK_TABLES
    }
    markers["{stream_columns}"] = select(STREAM_COLUMNS, "stream_column_", "column_")
    markers["{snapshot_columns}"] = ", ".join(SNAPSHOT_COLUMNS)
    markers["{snapshot_values}"] = ", ".join(f"m.{name}" for name in SNAPSHOT_COLUMNS)
    blocks = dict(blocks)
    for template, tables in _PER_TABLE.items():
        for table in tables:
            source, time_column = TABLE_SOURCES[table]
            blocks[table + template.removeprefix("table")] = (
                blocks[template]
                .replace("{table}", source)
                .replace("{time_column}", time_column)
                .replace("{columns}", f"{{{table}_columns}}")
            )
    filled = {}
    for name, body in blocks.items():
        for marker, text in markers.items():
            body = body.replace(marker, text)
        filled[name] = body
    return filled


def load_store_sql(dialect: str, *, schema: str = "") -> dict[str, str]:
    """The blocks of a store's ``<dialect>.sql``, with their column markers filled in; a
    block may ``-- include:`` a block of the broker's own SQL of that dialect (its claim)."""
    broker = load_sql(f"sqlbroker.storage.{dialect}", schema="{schema}")
    text = resources.files(__package__).joinpath(f"{dialect}.sql").read_text(encoding="utf-8")
    blocks = parse_blocks(text, shared=broker)
    return fill_columns({name: body.replace("{schema}", schema) for name, body in blocks.items()})


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)
"""The time window ``[EARLIEST, LATEST)`` of a row filter without ``since``/``until``."""


def content_hash(message: StageRow) -> str:
    """What makes two staged rows "the same message" for deterministic idempotency keys."""
    digest = hashlib.sha256()
    for part in (
        message.topic,
        message.content_type,
        message.headers or "",
        str(message.priority),
        message.ordering_key or "",
    ):
        digest.update(part.encode())
        digest.update(b"\x00")
    digest.update(message.payload)
    return digest.hexdigest()[:40]


class StagedKeys:
    """Messages for staged rows, a page at a time, in partition and row order.

    A row without an idempotency key gets ``key_prefix`` + content hash + its occurrence
    among identical rows of the job: identical rows stay distinct messages, and a re-run of
    the same job derives the same keys. Only the contents staged more than once
    (``repeated``, found by one query before the first page) need counting, so the memory
    held is that of the repeated contents, not of every row.
    """

    def __init__(self, key_prefix: str, repeated: Iterable[tuple[str, str]]) -> None:
        self._prefix = key_prefix
        self._seen = dict.fromkeys(repeated, 0)

    @property
    def topics(self) -> list[str]:
        """The topics of the repeated contents (with :attr:`hashes`, one pair each)."""
        return [slot[0] for slot in self._seen]

    @property
    def hashes(self) -> list[str]:
        return [slot[1] for slot in self._seen]

    def key(self, topic: str, digest: str) -> str:
        """The key of the next row (in partition and row order) without a key of its own
        with this topic and content hash."""
        slot = (topic, digest)
        occurrence = self._seen.get(slot, 0)
        if slot in self._seen:
            self._seen[slot] = occurrence + 1
        return f"{self._prefix}{digest}.{occurrence}"

    def messages(self, rows: Iterable[Mapping[str, Any]]) -> list[NewMessage]:
        messages = []
        for row in rows:
            key = row["idempotency_key"]
            if key is None:
                key = self.key(row["topic"], row["content_hash"])
            payload = bytes(row["payload"])
            messages.append(
                NewMessage(
                    message_id=new_message_id(),
                    topic=row["topic"],
                    payload=payload,
                    content_type=row["content_type"],
                    headers=row["headers"],
                    priority=row["priority"],
                    ordering_key=row["ordering_key"],
                    idempotency_key=key,
                    payload_hash=payload_hash(payload, row["content_type"]),
                    delay=None,
                    available_at=None,
                    ttl=None,
                    expires_at=None,
                    max_attempts=row["max_attempts"],
                    dedupe_window=float(row["dedupe_window"]),
                )
            )
        return messages
