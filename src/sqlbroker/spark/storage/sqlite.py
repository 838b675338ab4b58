"""The Spark store of a SQLite database.

Writes run in the broker's own write transactions (``Backend.begin()``), so they
take turns with every other writer of the file; reads open a connection of their own, so a
Spark read never holds the write lock.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager, suppress
from datetime import datetime
from functools import cache
from typing import Any

import pyarrow as pa

from sqlbroker.core.errors import DatabaseBusy, SchemaError, SqlbrokerError, StorageError
from sqlbroker.core.message import NewMessage
from sqlbroker.core.topics import regex_matches
from sqlbroker.spark.schema import record_batch
from sqlbroker.spark.storage.base import (
    Columns,
    ExportRun,
    IdRange,
    Published,
    SparkRowFilter,
    StreamAck,
)
from sqlbroker.spark.storage.columns import (
    SPARK_COLUMNS,
    STREAM_COLUMNS,
    StagedKeys,
    check_table,
    columns_of,
    fill_columns,
    publish_staged,
    stage_params,
)
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.base import InsertResult, Lease, Settlement
from sqlbroker.storage.sql import load_blocks

_NO_ID = -(2**63)
_ANY_ID = 2**63 - 1


@cache
def _queries() -> dict[str, str]:
    return fill_columns(load_blocks("sqlbroker.spark.storage", "sqlite.sql"))


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as error:
        text = str(error)
        if "locked" in text or "busy" in text:
            raise DatabaseBusy(f"the SQLite database was locked ({text})") from None
        if "no such table" in text:
            raise SchemaError(
                f"the sqlbroker schema is missing ({text}); run `sqlbroker migrate`"
            ) from None
        raise StorageError(f"SQLite error: {text}") from None
    except sqlite3.Error as error:
        raise StorageError(f"SQLite error: {error}") from None


def _bounds(where: SparkRowFilter, after_id: int, upto_id: int) -> dict[str, Any]:
    """Bind parameters of a row filter and an id range ``(after_id, upto_id]``."""
    if where.min_id is not None:
        after_id = max(after_id, where.min_id - 1)
    if where.max_id is not None:
        upto_id = min(upto_id, where.max_id)
    return {
        "subscription": where.subscription,
        "topic_regex": where.topic_regex,
        "since": None if where.since is None else where.since.timestamp(),
        "until": None if where.until is None else where.until.timestamp(),
        "after_id": after_id,
        "upto_id": upto_id,
    }


class SqliteSparkStore:
    """:class:`~sqlbroker.spark.storage.base.SparkStore` on the broker's SQLite file."""

    def __init__(self, backend: Backend, *, path: str, busy_timeout: float) -> None:
        self._backend = backend
        self._path = path
        self._busy_timeout = busy_timeout
        self._sql = _queries()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A connection of our own for reads (autocommit: each statement sees the latest
        commit, and no read holds a lock past its statement)."""
        with _translated():
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=self._busy_timeout)
            with closing(conn):
                conn.create_function("sqlbroker_regex_match", 2, regex_matches, deterministic=True)
                yield conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._backend.begin(timed=False) as tx, _translated():
            yield tx.connection

    def _now(self) -> float:
        return self._backend.now().timestamp()

    def identity(self) -> str:
        with self._read() as conn:
            row = conn.execute(self._sql["identity_get"]).fetchone()
        if row is None:
            raise SchemaError("the database has no identity row: run `sqlbroker migrate`")
        return str(row[0])

    # --- batch read --------------------------------------------------------------------------

    def id_range(self, *, where: SparkRowFilter) -> IdRange | None:
        table = check_table(where)
        with self._read() as conn:
            low, high, count = conn.execute(
                self._sql[f"{table}_range"], _bounds(where, _NO_ID, _ANY_ID)
            ).fetchone()
        return None if not count else IdRange(low=low, high=high, count=count)

    def rows_read(
        self, *, where: SparkRowFilter, after_id: int, upto_id: int, fetch: int
    ) -> Iterator[pa.RecordBatch]:
        table = check_table(where)
        names = SPARK_COLUMNS[table]
        with self._read() as conn:
            while True:
                params = {**_bounds(where, after_id, upto_id), "limit": fetch}
                with _translated():
                    rows = conn.execute(self._sql[f"{table}_read"], params).fetchall()
                if not rows:
                    return
                after_id = rows[-1][0]
                yield record_batch(columns_of(names, rows), names)
                if len(rows) < fetch:
                    return

    # --- idempotent batch write --------------------------------------------------------------

    def stage_insert(
        self, *, job: str, partition: int, attempt: int, first_seq: int, rows: Sequence[NewMessage]
    ) -> int:
        params = stage_params(
            job=job,
            partition=partition,
            attempt=attempt,
            first_seq=first_seq,
            rows=rows,
            now=self._now(),
        )
        with self._write() as conn:
            conn.executemany(self._sql["stage_insert"], params)
        return len(params)

    def stage_publish(
        self, *, job: str, winners: Sequence[tuple[int, int]], key_prefix: str, chunk: int
    ) -> Published:
        # Pages are read on a connection of our own, outside the write lock: only the
        # publish of each page holds it.
        with self._read() as reader:
            reader.row_factory = sqlite3.Row
            repeated = reader.execute(
                self._sql["stage_repeated"],
                {"job_id": job, "winners": json.dumps([list(w) for w in winners])},
            ).fetchall()

            def read_page(partition: int, attempt: int, after: int, limit: int) -> list[Any]:
                with _translated():
                    return reader.execute(
                        self._sql["stage_page"],
                        {
                            "job_id": job,
                            "partition_id": partition,
                            "attempt": attempt,
                            "after_seq": after,
                            "limit": limit,
                        },
                    ).fetchall()

            def publish_page(
                messages: Sequence[NewMessage], partition: int, attempt: int, upto: int
            ) -> InsertResult:
                with self._backend.begin(timed=False) as tx, _translated():
                    result = tx.message_insert_many(messages=messages, subscription=None)
                    tx.connection.execute(
                        self._sql["stage_delete_page"],
                        {
                            "job_id": job,
                            "partition_id": partition,
                            "attempt": attempt,
                            "upto_seq": upto,
                        },
                    )
                return result

            published = publish_staged(
                winners=winners,
                keys=StagedKeys(key_prefix, [(row[0], row[1]) for row in repeated]),
                chunk=chunk,
                read_page=read_page,
                publish_page=publish_page,
            )
        with self._write() as conn:  # what the losing attempts staged
            conn.execute(self._sql["stage_delete_job"], {"job_id": job})
        return published

    def stage_discard(self, *, job: str | None, older_than: datetime | None) -> int:
        deleted = 0
        with self._write() as conn:
            if job is not None:
                deleted += conn.execute(self._sql["stage_delete_job"], {"job_id": job}).rowcount
            if older_than is not None:
                deleted += conn.execute(
                    self._sql["stage_delete_older"], {"older_than": older_than.timestamp()}
                ).rowcount
        return deleted

    # --- streaming ---------------------------------------------------------------------------

    def stream_open(self, *, stream: str, subscription: str) -> tuple[int, int]:
        with self._write() as conn:
            conn.execute(
                self._sql["stream_insert"],
                {"stream": stream, "subscription": subscription, "now": self._now()},
            )
            last, acked = conn.execute(self._sql["stream_get"], {"stream": stream}).fetchone()
        return int(last), int(acked)

    def stream_claim(
        self, *, stream: str, subscription: str, limit: int, lease: float, worker: str
    ) -> int:
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
                (seq,) = conn.execute(self._sql["stream_next_seq"], {"stream": stream}).fetchone()
                conn.execute(
                    self._sql["stream_claim_snapshot"],
                    {
                        "stream": stream,
                        "seq": seq,
                        "now": self._now(),
                        "claimed": json.dumps([[c.id, c.token] for c in claimed]),
                    },
                )
        except BaseException:
            # Not in any snapshot: give the messages back rather than wait out the lease.
            with suppress(SqlbrokerError):
                self._backend.message_release_many(leases=claimed)
            raise
        return int(seq)

    def stream_read(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Columns:
        params = {
            "stream": stream,
            "after_seq": after_seq,
            "upto_seq": upto_seq,
            "part": part,
            "parts": parts,
        }
        with self._read() as conn:
            rows = conn.execute(self._sql["stream_read"], params).fetchall()
        return columns_of(STREAM_COLUMNS, rows)

    def _stream_leases(self, stream: str, upto_seq: int) -> list[Lease]:
        with self._read() as conn:
            rows = conn.execute(
                self._sql["stream_leases"], {"stream": stream, "upto_seq": upto_seq}
            ).fetchall()
        return [Lease(id=row[0], token=row[1]) for row in rows]

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

    # --- archive pipeline --------------------------------------------------------------------

    def export_commit(self, *, run: ExportRun) -> None:
        cutoff = run.cutoff.timestamp()
        with self._write() as conn:
            archived = conn.execute(
                self._sql["export_delete_archive"],
                {"cutoff": cutoff, "max_id": run.archive_max_id},
            ).rowcount
            dead = conn.execute(
                self._sql["export_delete_dead"], {"cutoff": cutoff, "max_id": run.dead_max_id}
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
                    "now": self._now(),
                },
            )

    def export_done(self, *, run_id: str) -> bool:
        with self._read() as conn:
            return bool(conn.execute(self._sql["export_get"], {"run_id": run_id}).fetchone()[0])
