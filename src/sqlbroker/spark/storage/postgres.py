"""The Spark store of a PostgreSQL database.

Batch reads go through ADBC: the server's rows arrive as Arrow batches and reach Spark
without a Python object per value. Everything else runs in the broker's own transactions
(``Backend.begin()``), on connections with its settings (login, role, schema,
durability), so row-level security sees the same tenant on every path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from typing import Any

import pyarrow as pa

from sqlbroker.core.errors import (
    ConnectionLost,
    IdempotencyConflict,
    InvalidOption,
    SchemaError,
    StorageError,
)
from sqlbroker.spark.schema import arrow_schema
from sqlbroker.spark.storage.base import (
    ExportRun,
    IdRange,
    Published,
    SparkRowFilter,
)
from sqlbroker.spark.storage.columns import (
    LATEST,
    SPARK_COLUMNS,
    STREAM_COLUMNS,
    StagedKeys,
    load_store_sql,
)
from sqlbroker.spark.storage.store import Driver, SparkStore
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.postgres.dialect import channel_name

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_UNLIMITED = 2**62  # no copy limit on a staged publish (the broker's max_copies unset)
_STAGE_TYPES = (
    "text",
    "integer",
    "bigint",
    "integer",
    "text",
    "bytea",
    "text",
    "text",
    "smallint",
    "text",
    "text",
    "text",
    "integer",
    "float8",
    "timestamptz",
)


@cache
def _queries(schema: str | None) -> dict[str, str]:
    if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
        raise InvalidOption("schema", "must be a lowercase SQL identifier")
    qualifier = "" if schema is None else f'"{schema}".'
    return load_store_sql("postgres", schema=qualifier)


class PostgresSparkStore(SparkStore):
    """:class:`~sqlbroker.spark.storage.store.SparkStore` on the broker's PostgreSQL
    database (and schema)."""

    parallel_publish = True

    def __init__(self, backend: Backend, *, url: str, schema: str | None) -> None:
        super().__init__(backend, _queries(schema))
        self._url = url
        self._channel = channel_name(schema)

    @contextmanager
    def _arrow(self) -> Iterator[Any]:
        """An ADBC cursor of a connection of our own (the URL's login, so the same tenant)."""
        import adbc_driver_manager.dbapi as adbc_errors
        import adbc_driver_postgresql.dbapi as adbc

        try:
            with adbc.connect(self._url) as conn, conn.cursor() as cursor:
                yield cursor
        except adbc_errors.Error as error:
            text = str(error).strip()
            if "does not exist" in text and "relation" in text:
                raise SchemaError(
                    f"the sqlbroker schema is missing ({text}); run `sqlbroker migrate`"
                ) from None
            if isinstance(error, adbc_errors.OperationalError):
                raise ConnectionLost(f"PostgreSQL: {text}", ambiguous=False, write=False) from None
            raise StorageError(f"PostgreSQL error: {text}") from None

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A transaction of the broker (its errors arrive translated), never cut for
        taking long: its bulk statements may."""
        with self._backend.begin(timed=False) as tx:
            yield tx.connection

    _read = _write  # row security and the schema apply as they do to the broker's reads

    # --- batch read --------------------------------------------------------------------------

    def id_range(self, *, where: SparkRowFilter) -> IdRange | None:
        table, params = self._filter(where)
        with self._arrow() as cursor:
            cursor.execute(self._sql[f"{table}_range"], params)
            row = cursor.fetchone()
        if row is None or not row[2]:
            return None
        return IdRange(low=int(row[0]), high=int(row[1]), count=int(row[2]))

    def rows_read(
        self, *, where: SparkRowFilter, after_id: int, upto_id: int, fetch: int
    ) -> Iterator[pa.RecordBatch]:
        table, params = self._filter(where, after_id, upto_id)
        target = arrow_schema(SPARK_COLUMNS[table])
        with self._arrow() as cursor:
            cursor.execute(self._sql[f"{table}_read"], params)
            for batch in cursor.fetch_record_batch():
                for start in range(0, batch.num_rows, fetch):
                    yield batch.slice(start, fetch).cast(target)

    # --- the stream's executor read ----------------------------------------------------------

    def stream_batches(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Iterator[pa.RecordBatch]:
        target = arrow_schema(STREAM_COLUMNS)
        with self._arrow() as cursor:
            cursor.execute(self._sql["stream_read"], (stream, after_seq, upto_seq, parts, part))
            for batch in cursor.fetch_record_batch():
                if batch.num_rows:
                    yield batch.cast(target)

    # --- idempotent batch write --------------------------------------------------------------

    def _stage(self, params: list[dict[str, Any]]) -> None:
        """By COPY, unless the staging table has row security (tenant isolation), which
        COPY refuses: then one INSERT a row (the policy checks every one)."""
        with self._write() as conn, conn.cursor() as cursor:
            (secured,) = cursor.execute(self._sql["stage_row_security"]).fetchone() or (False,)
            if secured:
                cursor.executemany(self._sql["stage_insert"], params)
                return
            with cursor.copy(self._sql["stage_copy"]) as copy:
                copy.set_types(_STAGE_TYPES)
                for row in params:  # stage_insert's keys are stage_copy's columns, in order
                    copy.write_row(tuple(row.values()))

    def _publish_page(self, page: dict[str, Any], keys: StagedKeys) -> Published:
        """Two statements that never bring a payload back to Python: reserve the page's
        keys, then insert its rows with the broker's own routing."""
        with self._write() as conn:
            conn.execute(self._sql["publish_settings"])
            counted: list[tuple[int, str]] = []
            if keys.hashes:  # contents staged more than once: counted in partition order
                rows = conn.execute(
                    self._sql["stage_page_repeated"],
                    {**page, "topics": keys.topics, "hashes": keys.hashes},
                ).fetchall()
                counted = [(int(seq), keys.key(topic, digest)) for seq, topic, digest in rows]
            page = {**page, "key_seqs": [c[0] for c in counted], "keys": [c[1] for c in counted]}
            row = conn.execute(self._sql["stage_page_reserve"], page).fetchone()
            assert row is not None
            size, seqs, ids, ordering_keys, topics, taken_keys, hashes = row[:7]
            repeat_topic, repeat_key, repeat_id = row[7:]
            if taken_keys:
                conn.execute(self._sql["publish_settings_reset"])
                existing = {
                    (topic, key): (str(message_id), digest)
                    for topic, key, message_id, digest in conn.execute(
                        self._sql["stage_dedupe_get"],
                        {"topic": topics, "idempotency_key": taken_keys},
                    )
                }
                for topic, key, digest in zip(topics, taken_keys, hashes, strict=True):
                    found = existing.get((topic, key))
                    if found is not None and found[1] != digest:
                        raise IdempotencyConflict(topic, key, found[0])
                    if (topic, key) == (repeat_topic, repeat_key) and found is not None:
                        repeat_id = found[0]
            if repeat_topic is not None:
                raise IdempotencyConflict(repeat_topic, repeat_key, repeat_id)
            routed = 0
            if seqs:
                if ordering_keys:
                    conn.execute(self._sql["stage_key_lock"], {"keys": ordering_keys})
                result = conn.execute(
                    self._sql["stage_page_insert"],
                    {
                        **page,
                        "seqs": seqs,
                        "ids": ids,
                        "subscription": None,
                        "queue_regex": None,
                        "channel": self._channel,
                        "max_copies": _UNLIMITED,
                    },
                ).fetchone()
                routed = int(result[0]) if result else 0
            conn.execute(self._sql["stage_delete_page"], page)
        return Published(published=len(seqs), duplicates=int(size) - len(seqs), unrouted=routed)

    # --- the hooks of SparkStore --------------------------------------------------------------

    def _time(self, value: datetime | None) -> datetime | None:
        return value  # None: the server's statement_timestamp()

    def _array(self, values: list[Any]) -> list[Any]:
        return values

    def _export_drop(self, conn: Driver, run: ExportRun) -> int:
        """Drop the archive's daily partitions that lie wholly before the cutoff and hold
        no row past the run's id watermark (a row that arrived after the export read);
        return how many exported rows went with them. The rest of the range (the default
        partition, the day of the cutoff, a day that could not be dropped now) is left to
        the row delete that follows."""
        conn.execute(self._sql["export_lock"])
        parts = conn.execute(self._sql["export_partitions"], {"cutoff": run.cutoff}).fetchall()
        whole = sorted(
            ((upper, name, int(rows), int(max_id)) for name, rows, max_id, upper in parts),
            key=lambda part: (part[0] is None, part[0] or LATEST),
        )
        # Every day before the cutoff, up to the first that holds a row past the watermark
        # (a day without rows there holds no row at all: it goes too).
        drop_before: datetime | None = run.cutoff
        previous = None
        for upper, _name, _rows, max_id in whole:
            if upper is None:
                continue
            if max_id > run.archive_max_id:
                drop_before = previous
                break
            previous = upper
        if drop_before is None:
            return 0
        conn.execute(self._sql["export_drop_days"], {"drop_before": drop_before})
        dropped = 0
        for upper, name, rows, _max_id in whole:
            if upper is None or upper > drop_before:
                break
            row = conn.execute(self._sql["export_partition_exists"], {"name": name}).fetchone()
            if row is not None and not row[0]:
                dropped += rows
        return dropped
