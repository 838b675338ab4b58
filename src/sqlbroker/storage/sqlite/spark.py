"""SQLite operations of the Spark data source and the archive pipeline (a mixin)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlbroker.core.errors import SchemaError, StorageError
from sqlbroker.core.message import NewMessage
from sqlbroker.storage.base import InsertResult, Lease
from sqlbroker.storage.rows import batched
from sqlbroker.storage.spark_base import Columns, ExportRun, IdRange, SparkRowFilter, StreamAck
from sqlbroker.storage.spark_rows import (
    SPARK_COLUMNS,
    STREAM_COLUMNS,
    check_table,
    columns_of,
    filter_params,
    messages_from_stage,
    stage_params,
)
from sqlbroker.storage.sql import load_blocks
from sqlbroker.storage.sqlite.connection import SqlitePool

_PUBLISH_CHUNK = 5_000


class SqliteSpark:
    """Spark operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool
    _sql: dict[str, str]
    _spark_sql_cache: dict[str, str] | None = None

    def _now(self) -> float:
        raise NotImplementedError

    def message_insert_many(
        self, *, messages: Sequence[NewMessage], subscription: str | None, conn: Any = None
    ) -> InsertResult:
        raise NotImplementedError

    message_complete_many: Callable[..., list[int]]

    message_extend_leases: Callable[..., dict[int, datetime]]

    @property
    def _spark(self) -> dict[str, str]:
        if self._spark_sql_cache is None:
            self._spark_sql_cache = load_blocks("sqlbroker.storage.sqlite", "spark.sql")
        return self._spark_sql_cache

    def spark_identity(self) -> str:
        with self._db.read() as conn:
            row = conn.execute(self._spark["identity_get"]).fetchone()
        if row is None:
            raise SchemaError("the database has no identity row: run `sqlbroker migrate`")
        return str(row[0])

    # --- batch read --------------------------------------------------------------------------

    def spark_id_range(self, *, where: SparkRowFilter) -> IdRange | None:
        table = check_table(where)
        with self._db.read() as conn:
            low, high, count = conn.execute(
                self._spark[f"{table}_range"], filter_params(where, epoch=True)
            ).fetchone()
        return None if not count else IdRange(low=low, high=high, count=count)

    def spark_rows_read(
        self, *, where: SparkRowFilter, after_id: int, upto_id: int, limit: int
    ) -> Columns:
        table = check_table(where)
        params = {
            **filter_params(where, epoch=True),
            "after_id": after_id,
            "upto_id": upto_id,
            "limit": limit,
        }
        with self._db.read() as conn:
            rows = conn.execute(self._spark[f"{table}_read"], params).fetchall()
        return columns_of(SPARK_COLUMNS[table], rows)

    # --- idempotent batch write --------------------------------------------------------------

    def spark_stage_insert(
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
        with self._db.write() as conn:
            conn.executemany(self._spark["stage_insert"], params)
        return len(params)

    def spark_stage_publish(
        self, *, job: str, winners: Sequence[tuple[int, int]], key_prefix: str
    ) -> InsertResult:
        ids: list[str] = []
        duplicates = unrouted = 0
        with self._db.write() as conn:
            cursor = conn.execute(
                self._spark["stage_select"],
                {"job_id": job, "winners": json.dumps([list(w) for w in winners])},
            )
            cursor.row_factory = sqlite3.Row
            messages = messages_from_stage(cursor, key_prefix=key_prefix)
            for chunk in batched(messages, _PUBLISH_CHUNK):
                result = self.message_insert_many(messages=chunk, subscription=None, conn=conn)
                ids.extend(result.message_ids)
                duplicates += result.duplicates
                unrouted += result.unrouted
            conn.execute(self._spark["stage_delete_job"], {"job_id": job})
        return InsertResult(message_ids=ids, duplicates=duplicates, unrouted=unrouted)

    def spark_stage_discard(self, *, job: str | None, older_than: datetime | None) -> int:
        with self._db.write() as conn:
            deleted = 0
            if job is not None:
                deleted += conn.execute(self._spark["stage_delete_job"], {"job_id": job}).rowcount
            if older_than is not None:
                deleted += conn.execute(
                    self._spark["stage_delete_older"], {"older_than": older_than.timestamp()}
                ).rowcount
        return deleted

    # --- streaming ---------------------------------------------------------------------------

    def spark_stream_open(self, *, stream: str, subscription: str) -> tuple[int, int]:
        with self._db.write() as conn:
            conn.execute(
                self._spark["stream_insert"],
                {"stream": stream, "subscription": subscription, "now": self._now()},
            )
            last, acked = conn.execute(self._spark["stream_get"], {"stream": stream}).fetchone()
        return int(last), int(acked)

    def spark_stream_claim(
        self, *, stream: str, subscription: str, limit: int, lease: float, worker: str
    ) -> int:
        now = self._now()
        with self._db.write() as conn:
            conn.execute(
                self._sql["message_promote_scheduled"],
                {"subscription": subscription, "now": now, "limit": max(limit, 1000)},
            )
            claimed = conn.execute(
                self._sql["message_claim"],
                {
                    "subscription": subscription,
                    "now": now,
                    "lease": lease,
                    "limit": limit,
                    "worker": worker,
                    "max_attempts": None,
                },
            ).fetchall()
            if not claimed:
                row = conn.execute(self._spark["stream_get"], {"stream": stream}).fetchone()
                return int(row[0])
            (seq,) = conn.execute(self._spark["stream_next_seq"], {"stream": stream}).fetchone()
            conn.execute(
                self._spark["stream_claim_snapshot"],
                {
                    "stream": stream,
                    "seq": seq,
                    "now": now,
                    "claimed": json.dumps([[row["id"], row["lease_token"]] for row in claimed]),
                },
            )
        return int(seq)

    def spark_stream_read(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Columns:
        params = {
            "stream": stream,
            "after_seq": after_seq,
            "upto_seq": upto_seq,
            "part": part,
            "parts": parts,
        }
        with self._db.read() as conn:
            rows = conn.execute(self._spark["stream_read"], params).fetchall()
        return columns_of(STREAM_COLUMNS, rows)

    def _stream_leases(self, stream: str, upto_seq: int) -> list[Lease]:
        with self._db.read() as conn:
            rows = conn.execute(
                self._spark["stream_leases"], {"stream": stream, "upto_seq": upto_seq}
            ).fetchall()
        return [Lease(id=row[0], token=row[1]) for row in rows]

    def spark_stream_extend(self, *, stream: str, upto_seq: int, lease: float) -> int:
        leases = self._stream_leases(stream, upto_seq)
        return len(self.message_extend_leases(leases=leases, lease=lease)) if leases else 0

    def spark_stream_ack(self, *, stream: str, upto_seq: int) -> StreamAck:
        leases = self._stream_leases(stream, upto_seq)
        done = self.message_complete_many(leases=leases) if leases else []
        # Forgetting the claims after the completion: a crash in between leaves claims
        # whose leases are gone, which the next ack forgets.
        with self._db.write() as conn:
            params = {"stream": stream, "upto_seq": upto_seq}
            conn.execute(self._spark["stream_forget"], params)
            conn.execute(self._spark["stream_acked"], params)
        return StreamAck(acked=len(done), lost=len(leases) - len(done))

    # --- archive pipeline --------------------------------------------------------------------

    def archive_export_commit(self, *, run: ExportRun) -> None:
        cutoff = run.cutoff.timestamp()
        with self._db.write() as conn:
            archived = conn.execute(
                self._spark["export_delete_archive"],
                {"cutoff": cutoff, "max_id": run.archive_max_id},
            ).rowcount
            dead = conn.execute(
                self._spark["export_delete_dead"], {"cutoff": cutoff, "max_id": run.dead_max_id}
            ).rowcount
            if (archived, dead) != (run.archive_rows, run.dead_rows):
                raise StorageError(
                    f"export {run.run_id}: the database holds {archived} archive rows and"
                    f" {dead} dead letters in the exported range, the Parquet files"
                    f" {run.archive_rows} and {run.dead_rows}; nothing was deleted"
                )
            conn.execute(
                self._spark["export_record"],
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

    def archive_export_done(self, *, run_id: str) -> bool:
        with self._db.read() as conn:
            return bool(conn.execute(self._spark["export_get"], {"run_id": run_id}).fetchone()[0])
