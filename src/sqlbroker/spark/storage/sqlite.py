"""The Spark store of a SQLite database.

Writes run in the broker's own write transactions (``Backend.begin()``), so they
take turns with every other writer of the file; reads open a connection of their own, so a
Spark read never holds the write lock.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime
from functools import cache
from typing import Any

import pyarrow as pa

from sqlbroker.core.topics import regex_matches
from sqlbroker.spark.schema import record_batch
from sqlbroker.spark.storage.base import IdRange, Published, SparkRowFilter
from sqlbroker.spark.storage.columns import (
    SPARK_COLUMNS,
    STREAM_COLUMNS,
    StagedKeys,
    load_store_sql,
)
from sqlbroker.spark.storage.store import SparkStore
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.sqlite.connection import translated


@cache
def _queries() -> dict[str, str]:
    return load_store_sql("sqlite")


class SqliteSparkStore(SparkStore):
    """:class:`~sqlbroker.spark.storage.store.SparkStore` on the broker's SQLite file."""

    def __init__(self, backend: Backend, *, path: str, busy_timeout: float) -> None:
        super().__init__(backend, _queries())
        self._path = path
        self._busy_timeout = busy_timeout

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A connection of our own for reads (autocommit: each statement sees the latest
        commit, and no read holds a lock past its statement)."""
        with translated(self._busy_timeout):
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=self._busy_timeout)
            with closing(conn):
                conn.create_function("sqlbroker_regex_match", 2, regex_matches, deterministic=True)
                yield conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._backend.begin(timed=False) as tx, translated(self._busy_timeout):
            yield tx.connection

    def _stage(self, params: list[dict[str, Any]]) -> None:
        with self._write() as conn:
            conn.executemany(self._sql["stage_insert"], params)

    # --- batch read --------------------------------------------------------------------------

    def id_range(self, *, where: SparkRowFilter) -> IdRange | None:
        table, params = self._filter(where)
        with self._read() as conn:
            low, high, count = conn.execute(self._sql[f"{table}_range"], params).fetchone()
        return None if not count else IdRange(low=low, high=high, count=count)

    def rows_read(
        self, *, where: SparkRowFilter, after_id: int, upto_id: int, fetch: int
    ) -> Iterator[pa.RecordBatch]:
        with self._read() as conn:
            while True:
                table, params = self._filter(where, after_id, upto_id)
                with translated(self._busy_timeout):
                    rows = conn.execute(self._sql[f"{table}_read"], (*params, fetch)).fetchall()
                if not rows:
                    return
                after_id = rows[-1][0]
                yield record_batch(rows, SPARK_COLUMNS[table])
                if len(rows) < fetch:
                    return

    def stream_batches(
        self, *, stream: str, after_seq: int, upto_seq: int, part: int, parts: int
    ) -> Iterator[pa.RecordBatch]:
        params = {"after_seq": after_seq, "upto_seq": upto_seq, "part": part, "parts": parts}
        with self._read() as conn:
            rows = conn.execute(self._sql["stream_read"], {"stream": stream, **params}).fetchall()
        if rows:
            yield record_batch(rows, STREAM_COLUMNS)

    # --- idempotent batch write --------------------------------------------------------------

    def _publish_page(self, page: dict[str, Any], keys: StagedKeys) -> Published:
        """The page is read on a connection of our own, outside the write lock: only its
        publish holds it."""
        with self._read() as reader:
            reader.row_factory = sqlite3.Row
            messages = keys.messages(reader.execute(self._sql["stage_page"], page).fetchall())
        with self._backend.begin(timed=False) as tx, translated(self._busy_timeout):
            result = tx.message_insert_many(messages=messages, subscription=None)
            tx.connection.execute(self._sql["stage_delete_page"], page)
        return Published(
            published=len(result.message_ids) - result.duplicates,
            duplicates=result.duplicates,
            unrouted=result.unrouted,
        )

    # --- the hooks of SparkStore --------------------------------------------------------------

    def _time(self, value: datetime | None) -> float:
        return (self._backend.now() if value is None else value).timestamp()

    def _array(self, values: list[Any]) -> str:
        return json.dumps(values)
