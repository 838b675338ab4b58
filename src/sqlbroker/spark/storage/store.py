"""The plugin's storage protocol, :class:`SparkStore`: every operation of the Spark data
source and the archive pipeline, written once over what a backend's store supplies.

The core seam knows nothing of Spark: a store works on the tables of migration 0006 with
SQL of its own (``sqlite.sql``, ``postgres.sql``) and reaches the queue through the
broker's operations (publish, claim, complete, extend) and its transactions; a stream's
claim runs the broker's own claim statement (``-- include: message_claim``).
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlbroker.core.errors import InvalidOption, SchemaError, SqlbrokerError, StorageError
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.spark.storage.base import (
    SPARK_TABLES,
    ExportRun,
    ExportTotals,
    IdRange,
    Published,
    SparkRowFilter,
    StageRow,
    StreamAck,
)
from sqlbroker.spark.storage.columns import (
    EARLIEST,
    EXPORTED_TABLES,
    LATEST,
    StagedKeys,
    content_hash,
)
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.operations.messages import PROMOTE_BATCH

if TYPE_CHECKING:
    import pyarrow as pa


class Driver(Protocol):
    """What the shared store code uses of its dialect's own driver connection (psycopg's
    or sqlite3's): statements, run by ``execute``."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


class SparkStore(ABC):
    """Storage operations of the Spark data source and the archive pipeline.

    A backend's store supplies its SQL blocks (``_sql``), its read and write connections,
    how it binds a time and an array, its batch reads, and the publish of one page of
    staged rows; everything else is written here once."""

    parallel_publish = False
    """Whether :meth:`stage_publish` may publish on several connections at once."""

    def __init__(self, backend: Backend, sql: dict[str, str]) -> None:
        self._backend = backend
        self._sql = sql

    # --- what a backend's store supplies ---------------------------------------------------
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
    def _array(self, values: list[Any]) -> Any:
        """``values`` as the dialect binds an array (a SQL array, or JSON)."""

    @abstractmethod
    def _stage(self, params: list[dict[str, Any]]) -> None:
        """Insert the staged rows of :meth:`stage_insert`, in a transaction of the broker."""

    @abstractmethod
    def _publish_page(self, page: dict[str, Any], keys: StagedKeys) -> Published:
        """Publish one page of staged rows of a task attempt (``job_id``, ``partition_id``,
        ``attempt``, ``after_seq < seq <= upto_seq``, ``key_prefix``) with the keys of
        ``keys``, and delete them, in one transaction."""

    def _export_drop(self, conn: Driver, run: ExportRun) -> int:
        """Rows of the run removed before its row delete (PostgreSQL drops whole days)."""
        return 0

    def identity(self) -> str:
        """The database's identity: equal for every connection to the same database (and
        schema), different for any other, a fresh file or a clone included (SQLite: a copy
        of the file keeps it)."""
        with self._read() as conn:
            row = conn.execute(self._sql["identity_get"]).fetchone()
        if row is None:
            raise SchemaError("the database has no identity row: run `sqlbroker migrate`")
        return str(row[0])

    # --- batch read ------------------------------------------------------------------------
    def _filter(
        self, where: SparkRowFilter, after_id: int = -(2**63), upto_id: int = 2**63 - 1
    ) -> tuple[str, tuple[Any, ...]]:
        """The table of a row filter and the parameters of its ``table_where``, in order:
        subscription and topic regex (``''`` for any), the time window ``[since, until)``,
        and the id range ``(after_id, upto_id]`` (by default every id) narrowed to the
        filter's ``min_id``/``max_id``."""
        if where.table not in SPARK_TABLES:
            raise InvalidOption("table", f"must be one of {', '.join(SPARK_TABLES)}")
        if where.min_id is not None:
            after_id = max(after_id, where.min_id - 1)
        if where.max_id is not None:
            upto_id = min(upto_id, where.max_id)
        window = (self._time(where.since or EARLIEST), self._time(where.until or LATEST))
        return where.table, (
            where.subscription or "",
            where.topic_regex or "",
            *window,
            after_id,
            upto_id,
        )

    @abstractmethod
    def id_range(self, *, where: SparkRowFilter) -> IdRange | None:
        """The id range of the selected rows, or ``None`` when there are none."""

    @abstractmethod
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
        now = self._time(self._backend.now())
        self._stage(
            [  # in the columns of stage_copy (PostgreSQL), in order
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
        )
        return len(rows)

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
        ordered = sorted(winners)
        with self._read() as conn:
            repeated = conn.execute(
                self._sql["stage_repeated"],
                {
                    "job_id": job,
                    "partitions": self._array([w[0] for w in ordered]),
                    "attempts": self._array([w[1] for w in ordered]),
                },
            ).fetchall()
        keys = StagedKeys(key_prefix, [(row[0], row[1]) for row in repeated])
        # Repeated contents are counted in partition order (StagedKeys): one connection.
        lanes = 1 if repeated or not self.parallel_publish else min(connections, len(ordered))
        lanes = max(1, lanes)
        page = {"job_id": job, "key_prefix": key_prefix, "now": None}
        published = self._publish_lanes(
            page, [ordered[n::lanes] for n in range(lanes)], keys, chunk
        )
        with self._write() as conn:  # what the losing attempts staged
            conn.execute(self._sql["stage_delete_job"], {"job_id": job})
        return published

    def _publish_lanes(
        self, page: dict[str, Any], lanes: list[list[tuple[int, int]]], keys: StagedKeys, chunk: int
    ) -> Published:
        """The winners' pages, a lane after another on one connection, or one pooled
        connection per lane, in parallel (the database does the work: the threads only send
        statements). The first failure stops every lane after its current page and is
        raised; committed pages stay published, as a sequential publish that fails part-way
        leaves them (a re-run publishes the rest)."""
        if len(lanes) == 1:
            return self._publish_lane(page, lanes[0], keys, chunk, None)
        stop = threading.Event()
        with ThreadPoolExecutor(len(lanes), thread_name_prefix="sqlbroker-publish") as pool:
            futures = [
                pool.submit(self._publish_lane, page, lane, keys, chunk, stop) for lane in lanes
            ]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in done):
                stop.set()
            wait(futures)
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        return sum((f.result() for f in futures), Published(0, 0, 0))

    def _publish_lane(
        self,
        page: dict[str, Any],
        winners: Sequence[tuple[int, int]],
        keys: StagedKeys,
        chunk: int,
        stop: threading.Event | None,
    ) -> Published:
        """Publish the pages of ``winners`` one after another, in partition order."""
        published = Published(0, 0, 0)
        for partition, attempt in winners:
            after = -1
            while stop is None or not stop.is_set():
                done = self._publish_page(
                    {
                        **page,
                        "partition_id": partition,
                        "attempt": attempt,
                        "after_seq": after,
                        "upto_seq": after + chunk,
                    },
                    keys,
                )
                published += done
                if done.published + done.duplicates < chunk:
                    break
                after += chunk
        return published

    def stage_discard(self, *, job: str | None, older_than: datetime | None) -> int:
        """Delete the staged rows of ``job``, or of any job staged before ``older_than``."""
        deleted = 0
        with self._write() as conn:
            if job is not None:
                deleted += conn.execute(self._sql["stage_delete_job"], {"job_id": job}).rowcount
            if older_than is not None:
                deleted += conn.execute(
                    self._sql["stage_delete_older"], {"older_than": self._time(older_than)}
                ).rowcount
        return int(deleted)

    # --- streaming -------------------------------------------------------------------------
    def stream_open(self, *, stream: str, subscription: str) -> tuple[int, int]:
        """Create the stream on first use; return its ``(last_seq, acked_seq)``."""
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
        """Claim up to ``limit`` messages and snapshot them under a new sequence number;
        return the stream's last sequence (unchanged when none).

        The broker's plain claim (its ``message_claim`` SQL, only ids and tokens read
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
        params = {
            "stream": stream,
            "seq": seq,
            "now": self._time(None),
            "ids": self._array([c.id for c in claimed]),
            "tokens": self._array([c.token for c in claimed]),
        }
        conn.execute(self._sql["stream_claim_snapshot"], params)
        return int(seq)

    @abstractmethod
    def stream_batches(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Iterator[pa.RecordBatch]:
        """The snapshot of the claims ``after_seq < seq <= upto_seq`` whose delivery id is
        ``part`` modulo ``parts``, by sequence and delivery id, as Arrow batches of
        ``STREAM_COLUMNS`` (an executor's read; none when there are no such claims)."""

    def _stream_leases(self, stream: str, upto_seq: int) -> list[Lease]:
        with self._read() as conn:
            rows = conn.execute(
                self._sql["stream_leases"], {"stream": stream, "upto_seq": upto_seq}
            ).fetchall()
        return [Lease(id=int(row[0]), token=str(row[1])) for row in rows]

    def stream_extend(self, *, stream: str, upto_seq: int, lease: float) -> int:
        """Extend the leases of the unacked claims up to ``upto_seq``; return how many."""
        leases = self._stream_leases(stream, upto_seq)
        return len(self._backend.message_extend_leases(leases=leases, lease=lease)) if leases else 0

    def stream_ack(self, *, stream: str, upto_seq: int) -> StreamAck:
        """Complete the claims up to ``upto_seq`` and forget them. Claims whose lease was
        lost (another consumer has the message now) are counted as ``lost``."""
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

    # --- archive pipeline ------------------------------------------------------------------
    def export_commit(self, *, run: ExportRun) -> None:
        """In one transaction: delete the run's archive and dead-letter rows (older than
        the cutoff, ids up to the maxima) and record the run. Raise ``StorageError`` and
        delete nothing when the counts differ from the run's."""
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
        """Whether the run's delete committed."""
        with self._read() as conn:
            row = conn.execute(self._sql["export_get"], {"run_id": run_id}).fetchone()
        return bool(row and row[0])

    # --- the export's check against the database (issue 28 item 6) -----------------------

    def export_totals(
        self, *, table: str, cutoff: datetime, max_id: int
    ) -> dict[str, ExportTotals]:
        """Per topic, the rows of ``table`` (``archive`` or ``dead``) that ``export_commit``
        would delete now (older than ``cutoff``, ids up to ``max_id``), counted in SQL."""
        if table not in EXPORTED_TABLES:
            raise InvalidOption("table", f"must be archive or dead, not {table!r}")
        params = {"cutoff": self._time(cutoff), "max_id": max_id}
        with self._read() as conn:
            rows = conn.execute(self._sql[f"{table}_export_totals"], params).fetchall()
        return {
            str(topic): ExportTotals(rows=int(n), id_sum=int(ids), low=int(low), high=int(high))
            for topic, n, ids, low, high in rows
        }
