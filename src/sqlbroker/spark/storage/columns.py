"""The one column list of every Spark read, and what both stores share: staged rows, row
filters, the SQL markers the column list fills in, and :class:`SqlStore`, every operation
that reads the same on both backends."""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from datetime import datetime
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from sqlbroker.core.errors import InvalidOption, SchemaError, SqlbrokerError, StorageError
from sqlbroker.core.message import NewMessage, new_message_id
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.spark.storage.base import (
    SPARK_TABLES,
    Columns,
    ExportRun,
    ExportTotals,
    Published,
    SparkRowFilter,
    StageRow,
    StreamAck,
)
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.base import InsertResult
from sqlbroker.storage.operations.messages import PROMOTE_BATCH
from sqlbroker.storage.rows import payload_hash
from sqlbroker.storage.sql import load_sql, parse_blocks

if TYPE_CHECKING:
    import pyarrow as pa

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


def check_table(where: SparkRowFilter) -> str:
    if where.table not in SPARK_TABLES:
        raise InvalidOption("table", f"must be one of {', '.join(SPARK_TABLES)}")
    return where.table


EVERY_ID = (-(2**63), 2**63 - 1)
"""The id range ``(after_id, upto_id]`` of every row."""


def id_bounds(where: SparkRowFilter, after_id: int, upto_id: int) -> tuple[int, int]:
    """The id range ``(after_id, upto_id]`` narrowed to the filter's ``min_id``/``max_id``."""
    if where.min_id is not None:
        after_id = max(after_id, where.min_id - 1)
    if where.max_id is not None:
        upto_id = min(upto_id, where.max_id)
    return after_id, upto_id


def columns_of(names: Sequence[str], rows: Iterable[Sequence[Any]]) -> Columns:
    """Transpose rows into columns; payloads become ``bytes``."""
    columns: Columns = {name: [] for name in names}
    lists = [columns[name] for name in names]
    for row in rows:
        for target, value in zip(lists, row, strict=True):
            target.append(value)
    if "payload" in columns:
        columns["payload"] = [bytes(value) for value in columns["payload"]]
    return columns


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


def stage_params(
    *, job: str, partition: int, attempt: int, first_seq: int, rows: Sequence[StageRow], now: Any
) -> list[dict[str, Any]]:
    return [
        {
            "job_id": job,
            "partition_id": partition,
            "attempt": attempt,
            "seq": first_seq + index,
            "topic": message.topic,
            "payload": message.payload,
            "content_type": message.content_type,
            "headers": message.headers,
            "priority": message.priority,
            "ordering_key": message.ordering_key,
            "idempotency_key": message.idempotency_key,
            "content_hash": content_hash(message),
            "max_attempts": message.max_attempts,
            "dedupe_window": message.dedupe_window,
            "now": now,
        }
        for index, message in enumerate(rows)
    ]


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


def publish_staged(
    *,
    winners: Sequence[tuple[int, int]],
    keys: StagedKeys,
    chunk: int,
    read_page: Callable[[int, int, int, int], list[Mapping[str, Any]]],
    publish_page: Callable[[Sequence[NewMessage], int, int, int], InsertResult],
) -> Published:
    """The paging loop of ``SparkStore.stage_publish``: ``read_page(partition, attempt,
    after_seq, limit)`` returns staged rows by ``seq``; ``publish_page(messages, partition,
    attempt, upto_seq)`` publishes them and deletes their staged rows in one transaction."""
    published = duplicates = unrouted = 0
    for partition, attempt in sorted(winners):
        after = -1
        while True:
            rows = read_page(partition, attempt, after, chunk)
            if not rows:
                break
            after = int(rows[-1]["seq"])
            result = publish_page(keys.messages(rows), partition, attempt, after)
            published += len(result.message_ids) - result.duplicates
            duplicates += result.duplicates
            unrouted += result.unrouted
            if len(rows) < chunk:
                break
    return Published(published=published, duplicates=duplicates, unrouted=unrouted)


class Driver(Protocol):
    """What the shared store code uses of its dialect's own driver connection (psycopg's
    or sqlite3's): statements, run by ``execute``."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


class SqlStore(ABC):
    """The operations of :class:`~sqlbroker.spark.storage.base.SparkStore` that are the
    same on both backends, written once over what a dialect supplies: its SQL blocks
    (``_sql``), its read and write connections, and how it binds a time and a claim's
    leases."""

    def __init__(self, backend: Backend, sql: dict[str, str]) -> None:
        self._backend = backend
        self._sql = sql

    @abstractmethod
    def _read(self) -> AbstractContextManager[Driver]:
        """A connection for reads that take no write lock."""

    @abstractmethod
    def _write(self) -> AbstractContextManager[Driver]:
        """The connection of a broker transaction (``Backend.begin(timed=False)``)."""

    @abstractmethod
    def _time(self, value: datetime | None) -> Any:
        """``value`` as the dialect binds a time; ``None`` is "now" (the database's clock
        or the broker's)."""

    @abstractmethod
    def _leases(self, claimed: Sequence[Lease]) -> dict[str, Any]:
        """The parameters that bind a claim's leases in ``stream_claim_snapshot``."""

    def _export_drop(self, conn: Driver, run: ExportRun) -> int:
        """Rows of the run removed before its row delete (PostgreSQL drops whole days)."""
        return 0

    def identity(self) -> str:
        with self._read() as conn:
            row = conn.execute(self._sql["identity_get"]).fetchone()
        if row is None:
            raise SchemaError("the database has no identity row: run `sqlbroker migrate`")
        return str(row[0])

    def stage_discard(self, *, job: str | None, older_than: datetime | None) -> int:
        deleted = 0
        with self._write() as conn:
            if job is not None:
                deleted += conn.execute(self._sql["stage_delete_job"], {"job_id": job}).rowcount
            if older_than is not None:
                deleted += conn.execute(
                    self._sql["stage_delete_older"], {"older_than": self._time(older_than)}
                ).rowcount
        return int(deleted)

    def stage_insert(
        self, *, job: str, partition: int, attempt: int, first_seq: int, rows: Sequence[StageRow]
    ) -> int:
        params = stage_params(
            job=job,
            partition=partition,
            attempt=attempt,
            first_seq=first_seq,
            rows=rows,
            now=self._time(self._backend.now()),
        )
        self._stage(params)
        return len(params)

    @abstractmethod
    def _stage(self, params: list[dict[str, Any]]) -> None:
        """Insert the staged rows of :meth:`stage_insert`, in a transaction of the broker."""

    def stream_open(self, *, stream: str, subscription: str) -> tuple[int, int]:
        with self._write() as conn:
            conn.execute(
                self._sql["stream_insert"],
                {"stream": stream, "subscription": subscription, "now": self._time(None)},
            )
            last, acked = conn.execute(self._sql["stream_get"], {"stream": stream}).fetchone()
        return int(last), int(acked)

    def stream_claim(
        self, *, stream: str, subscription: str, limit: int, lease: float, worker: str
    ) -> int:
        """The broker's plain claim (its ``message_claim`` SQL, only ids and tokens read
        back) and the snapshot, in one transaction; a subscription it claims nothing from
        (flow limits, a pause) goes through the broker's own claim."""
        settings = self._backend.settings
        injected = settings.clock.now()
        promote_at = None if injected is None else injected.timestamp()
        now = self._time(injected)
        with self._write() as conn:
            if settings.promotion.due(subscription, promote_at):
                params = {"subscription": subscription, "limit": PROMOTE_BATCH, "now": now}
                conn.execute(self._sql["stream_promote"], params)
            cursor = conn.execute(
                self._sql["stream_claim_leases"],
                {
                    "subscription": subscription,
                    "limit": limit,
                    "lease": lease,
                    "worker": worker,
                    "max_attempts": None,
                    "claim_commit": settings.claim_commit,
                    "token": os.urandom(16).hex(),  # SQLite: the claim's lease tokens
                    "now": now,
                },
            )
            names = [column[0] for column in cursor.description]
            at_id, at_token = names.index("id"), names.index("lease_token")
            claimed = [Lease(id=int(r[at_id]), token=str(r[at_token])) for r in cursor.fetchall()]
            if claimed:
                return self._snapshot(conn, stream, claimed)
        claimed = [
            Lease.of(delivery)
            for delivery in self._backend.message_claim_many(
                subscription=subscription, limit=limit, lease=lease, worker=worker
            )
        ]
        if not claimed:
            with self._read() as conn:
                return int(conn.execute(self._sql["stream_get"], {"stream": stream}).fetchone()[0])
        try:
            with self._write() as conn:
                return self._snapshot(conn, stream, claimed)
        except BaseException:
            # Not in any snapshot: give the messages back rather than wait out the lease.
            with suppress(SqlbrokerError):
                self._backend.message_release_many(leases=claimed)
            raise

    def _snapshot(self, conn: Driver, stream: str, claimed: Sequence[Lease]) -> int:
        """Snapshot the claimed messages under the stream's next sequence number."""
        (seq,) = conn.execute(self._sql["stream_next_seq"], {"stream": stream}).fetchone()
        params = {"stream": stream, "seq": seq, "now": self._time(None)}
        params.update(self._leases(claimed))
        conn.execute(self._sql["stream_claim_snapshot"], params)
        return int(seq)

    def stream_read(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Columns:
        params = {"stream": stream, "after_seq": after_seq, "upto_seq": upto_seq, "part": part}
        with self._read() as conn:
            rows = conn.execute(self._sql["stream_read"], {**params, "parts": parts}).fetchall()
        return columns_of(STREAM_COLUMNS, rows)

    def stream_batches(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Iterator[pa.RecordBatch]:
        from sqlbroker.spark.schema import record_batch  # which imports this module

        columns = self.stream_read(
            stream=stream, after_seq=after_seq, upto_seq=upto_seq, part=part, parts=parts
        )
        if columns["id"]:
            yield record_batch(columns, STREAM_COLUMNS)

    def _stream_leases(self, stream: str, upto_seq: int) -> list[Lease]:
        with self._read() as conn:
            rows = conn.execute(
                self._sql["stream_leases"], {"stream": stream, "upto_seq": upto_seq}
            ).fetchall()
        return [Lease(id=int(row[0]), token=str(row[1])) for row in rows]

    def stream_extend(self, *, stream: str, upto_seq: int, lease: float) -> int:
        leases = self._stream_leases(stream, upto_seq)
        return len(self._backend.message_extend_leases(leases=leases, lease=lease)) if leases else 0

    def stream_ack(self, *, stream: str, upto_seq: int) -> StreamAck:
        leases = self._stream_leases(stream, upto_seq)
        done = self._backend.message_settle_many(
            settlements=[Settlement.complete(lease) for lease in leases]
        )
        # Forgetting the claims after the completion: a crash in between leaves claims
        # whose leases are gone, which the next ack forgets.
        with self._write() as conn:
            params = {"stream": stream, "upto_seq": upto_seq}
            conn.execute(self._sql["stream_forget"], params)
            conn.execute(self._sql["stream_acked"], params)
        return StreamAck(acked=len(done), lost=len(leases) - len(done))

    def export_commit(self, *, run: ExportRun) -> None:
        cutoff = self._time(run.cutoff)
        with self._write() as conn:
            archived = self._export_drop(conn, run)
            archived += conn.execute(
                self._sql["archive_export_delete"], {"cutoff": cutoff, "max_id": run.archive_max_id}
            ).rowcount
            dead = conn.execute(
                self._sql["dead_export_delete"], {"cutoff": cutoff, "max_id": run.dead_max_id}
            ).rowcount
            if (archived, dead) != (run.archive_rows, run.dead_rows):
                raise StorageError(
                    f"export {run.run_id}: the database holds {archived} archive rows and"
                    f" {dead} dead letters in the exported range, the Parquet files"
                    f" {run.archive_rows} and {run.dead_rows}; nothing was deleted"
                )
            conn.execute(
                self._sql["export_record"],
                {
                    "run_id": run.run_id,
                    "cutoff": cutoff,
                    "archive_max_id": run.archive_max_id,
                    "dead_max_id": run.dead_max_id,
                    "archive_rows": run.archive_rows,
                    "dead_rows": run.dead_rows,
                    "now": self._time(None),
                },
            )

    def export_done(self, *, run_id: str) -> bool:
        with self._read() as conn:
            row = conn.execute(self._sql["export_get"], {"run_id": run_id}).fetchone()
        return bool(row and row[0])

    # --- the export's check against the database (issue 28 item 6) -----------------------

    def export_totals(
        self, *, table: str, cutoff: datetime, max_id: int
    ) -> dict[str, ExportTotals]:
        if table not in EXPORTED_TABLES:
            raise InvalidOption("table", f"must be archive or dead, not {table!r}")
        params = {"cutoff": self._time(cutoff), "max_id": max_id}
        with self._read() as conn:
            rows = conn.execute(self._sql[f"{table}_export_totals"], params).fetchall()
        return {
            str(topic): ExportTotals(rows=int(n), id_sum=int(ids), low=int(low), high=int(high))
            for topic, n, ids, low, high in rows
        }
