"""The plugin's storage protocol, :class:`SparkStore`, and the values it takes and returns.

The core seam knows nothing of Spark: a store works on the tables of migration 0006 with
SQL of its own (``sqlite.sql``, ``postgres.sql``) and reaches the queue through the
broker's operations (publish, claim, complete, extend) and its transactions; a stream's
claim runs the broker's own claim statement (``-- include: message_claim``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

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


Columns = dict[str, list[Any]]
"""Rows column by column; times are float seconds since the Unix epoch (UTC) or aware
datetimes."""


@dataclass(frozen=True, slots=True)
class Published:
    """What a write's commit published: new messages, duplicates of earlier ones (a re-run,
    or a key already used), and messages no subscription matched (archived as unrouted)."""

    published: int
    duplicates: int
    unrouted: int


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


class SparkStore(Protocol):
    """Storage operations of the Spark data source and the archive pipeline."""

    def identity(self) -> str:
        """The database's identity: equal for every connection to the same database (and
        schema), different for any other, a fresh file or a clone included (SQLite: a copy
        of the file keeps it)."""

    # --- batch read ------------------------------------------------------------------------
    def id_range(self, *, where: SparkRowFilter) -> IdRange | None:
        """The id range of the selected rows, or ``None`` when there are none."""

    def rows_read(
        self, *, where: SparkRowFilter, after_id: int, upto_id: int, fetch: int
    ) -> Iterator[pa.RecordBatch]:
        """Selected rows with ``after_id < id <= upto_id``, by id, as Arrow batches of the
        table's schema (``SPARK_COLUMNS[where.table]``) of at most ``fetch`` rows."""

    # --- idempotent batch write ------------------------------------------------------------
    def stage_insert(
        self, *, job: str, partition: int, attempt: int, first_seq: int, rows: Sequence[StageRow]
    ) -> int:
        """Stage validated messages of one task attempt (numbered from ``first_seq``)."""

    def stage_publish(
        self,
        *,
        job: str,
        winners: Sequence[tuple[int, int]],
        key_prefix: str,
        chunk: int,
        connections: int = 1,
    ) -> Published:
        """Publish the staged rows of the winning ``(partition, attempt)`` pairs, then delete
        every staged row of the job.

        The rows go out in transactions of at most ``chunk`` messages, each deleting the
        staged rows it published, so no transaction holds a large write and the driver
        holds one chunk at a time. A row without an idempotency key gets ``key_prefix`` +
        its content hash + its occurrence among identical rows of the job (in partition and
        row order), so a re-run of the same job publishes nothing new within the dedupe
        window, and a commit that failed part-way publishes, re-run, exactly the rest.

        ``connections`` > 1 lets PostgreSQL publish the pages of different partitions in
        parallel transactions when no content was staged twice (else one connection, to
        count them in order). Rows with ordering keys then lose their order across
        partitions: pass 1 for them. SQLite has one writer and ignores it."""

    def stage_discard(self, *, job: str | None, older_than: datetime | None) -> int:
        """Delete the staged rows of ``job``, or of any job staged before ``older_than``."""

    # --- streaming -------------------------------------------------------------------------
    def stream_open(self, *, stream: str, subscription: str) -> tuple[int, int]:
        """Create the stream on first use; return its ``(last_seq, acked_seq)``."""

    def stream_claim(
        self, *, stream: str, subscription: str, limit: int, lease: float, worker: str
    ) -> int:
        """Claim up to ``limit`` messages and snapshot them under a new sequence number;
        return the stream's last sequence (unchanged when none)."""

    def stream_read(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Columns:
        """The snapshot of the claims ``after_seq < seq <= upto_seq`` whose delivery id is
        ``part`` modulo ``parts``, by sequence and delivery id, in ``STREAM_COLUMNS``."""

    def stream_batches(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Iterator[pa.RecordBatch]:
        """What :meth:`stream_read` reads, as Arrow batches of ``STREAM_COLUMNS`` (an
        executor's read: PostgreSQL's rows arrive as Arrow, no Python object per value)."""

    def stream_extend(self, *, stream: str, upto_seq: int, lease: float) -> int:
        """Extend the leases of the unacked claims up to ``upto_seq``; return how many."""

    def stream_ack(self, *, stream: str, upto_seq: int) -> StreamAck:
        """Complete the claims up to ``upto_seq`` and forget them. Claims whose lease was
        lost (another consumer has the message now) are counted as ``lost``."""

    # --- archive pipeline ------------------------------------------------------------------
    def export_commit(self, *, run: ExportRun) -> None:
        """In one transaction: delete the run's archive and dead-letter rows (older than
        the cutoff, ids up to the maxima) and record the run. Raise ``StorageError`` and
        delete nothing when the counts differ from the run's."""

    def export_done(self, *, run_id: str) -> bool:
        """Whether the run's delete committed."""

    def export_totals(
        self, *, table: str, cutoff: datetime, max_id: int
    ) -> dict[str, ExportTotals]:
        """Per topic, the rows of ``table`` (``archive`` or ``dead``) that ``export_commit``
        would delete now (older than ``cutoff``, ids up to ``max_id``), counted in SQL."""
