"""The values the plugin's store (:class:`~sqlbroker.spark.storage.store.SparkStore`) takes
and returns."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

SPARK_TABLES = ("messages", "archive", "dead")
"""The tables a Spark batch read can scan (``option("table", …)``)."""


@dataclass(frozen=True, slots=True)
class SparkRowFilter:
    """Selects rows of one table for a Spark read; ``None`` matches anything.

    ``since``/``until`` bound the table's time column (``enqueued_at`` for messages,
    ``finished_at`` for the archive, ``dead_at`` for dead letters), ``until`` exclusive;
    ``topic_regex`` is a compiled topic pattern (see ``core.topics.pattern_regex``).
    """

    table: str
    subscription: str | None = None
    topic_regex: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    min_id: int | None = None
    max_id: int | None = None


@dataclass(frozen=True, slots=True)
class IdRange:
    """The smallest and largest id of the rows a filter selects, and how many there are."""

    low: int
    high: int
    count: int


@dataclass(frozen=True, slots=True)
class Published:
    """What a write's commit published: new messages, duplicates of earlier ones (a re-run,
    or a key already used), and messages no subscription matched (archived as unrouted)."""

    published: int
    duplicates: int
    unrouted: int

    def __add__(self, other: Published) -> Published:
        return Published(
            published=self.published + other.published,
            duplicates=self.duplicates + other.duplicates,
            unrouted=self.unrouted + other.unrouted,
        )


@dataclass(frozen=True, slots=True)
class StreamAck:
    acked: int
    lost: int


@dataclass(frozen=True, slots=True)
class ExportRun:
    """An archive export whose Parquet files were verified: delete exactly these rows."""

    run_id: str
    cutoff: datetime
    archive_max_id: int
    dead_max_id: int
    archive_rows: int
    dead_rows: int


@dataclass(frozen=True, slots=True)
class ExportTotals:
    """What the database holds of one topic in an export's range: how many rows, the sum
    of their ids, and their smallest and largest id."""

    rows: int
    id_sum: int
    low: int
    high: int


class StageRow(Protocol):
    """What a store stages of a validated row: a ``NewMessage`` or the write's lighter
    ``StagedRow`` (no message id: the publish makes those)."""

    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def content_type(self) -> str: ...
    @property
    def headers(self) -> str | None: ...
    @property
    def priority(self) -> int: ...
    @property
    def ordering_key(self) -> str | None: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def dedupe_window(self) -> float: ...
