"""PostgreSQL stored results: the lookup, the retention trim, and the watch a waiting
``broker.result(…, wait=)`` sleeps on (LISTEN on a connection of its own). The values are
written by ``message_complete_valued`` (queries.sql), which NOTIFYs the result channel
with the message id in the same commit; dead letters are announced on the dead channel."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from sqlbroker.core.results import ResultRecord
from sqlbroker.storage.columns import utc
from sqlbroker.storage.postgres.connection import PostgresPool, connect_failure


def _records(rows: list[tuple[Any, ...]]) -> list[ResultRecord]:
    return [
        ResultRecord(
            subscription=row[0],
            kind=row[1],
            value=None if row[2] is None else bytes(row[2]),
            reason=row[3],
            error_type=row[4],
            error_message=row[5],
            traceback=row[6],
            finished_at=None if row[7] is None else utc(row[7]),
        )
        for row in rows
    ]


class _Watch:
    def __init__(self, conn: psycopg.Connection[Any], message_id: str, dead_channel: str) -> None:
        self._conn = conn
        self._message_id = message_id
        self._dead_channel = dead_channel

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                for notice in self._conn.notifies(timeout=remaining, stop_after=1):
                    if notice.payload == self._message_id or notice.channel == self._dead_channel:
                        return True
        except psycopg.Error as error:
            raise connect_failure(
                "the result watch lost its connection", error, write=False
            ) from error
        return False


class _AsyncWatch:
    def __init__(
        self, conn: psycopg.AsyncConnection[Any], message_id: str, dead_channel: str
    ) -> None:
        self._conn = conn
        self._message_id = message_id
        self._dead_channel = dead_channel

    async def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                async for notice in self._conn.notifies(timeout=remaining, stop_after=1):
                    if notice.payload == self._message_id or notice.channel == self._dead_channel:
                        return True
        except psycopg.Error as error:
            raise connect_failure(
                "the result watch lost its connection", error, write=False
            ) from error
        return False


class PostgresResults:
    """Stored-result operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _sql: dict[str, str]
    result_channel: str
    dead_channel: str

    def _now_param(self) -> datetime | None:
        raise NotImplementedError

    def result_lookup(self, *, message_id: str) -> list[ResultRecord]:
        with self._db.connection(write=False) as conn:
            rows = conn.execute(self._sql["result_lookup"], {"message_id": message_id}).fetchall()
        return _records(rows)

    def result_trim(self, *, ttl: float, limit: int) -> int:
        with self._db.connection(write=True) as conn:
            return conn.execute(
                self._sql["result_trim"], {"now": self._now_param(), "ttl": ttl, "limit": limit}
            ).rowcount

    def _listen_statement(self) -> sql.Composed:
        return sql.SQL("LISTEN {}; LISTEN {}").format(
            sql.Identifier(self.result_channel), sql.Identifier(self.dead_channel)
        )

    @contextmanager
    def result_watch(self, *, message_id: str) -> Iterator[_Watch]:
        # A connection of its own, not the pool's: it sits in LISTEN for the whole wait.
        try:
            conn = psycopg.Connection.connect(self._db.conninfo, **self._db.connection_kwargs())
        except psycopg.Error as error:
            raise connect_failure(
                "the result watch could not connect", error, write=False
            ) from error
        try:
            try:
                conn.execute(self._listen_statement())
            except psycopg.Error as error:
                raise connect_failure(
                    "the result watch could not LISTEN", error, write=False
                ) from error
            yield _Watch(conn, message_id, self.dead_channel)
        finally:
            conn.close()

    @asynccontextmanager
    async def result_watch_async(self, *, message_id: str) -> AsyncIterator[_AsyncWatch]:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._db.conninfo, **self._db.connection_kwargs()
            )
        except psycopg.Error as error:
            raise connect_failure(
                "the result watch could not connect", error, write=False
            ) from error
        try:
            try:
                await conn.execute(self._listen_statement())
            except psycopg.Error as error:
                raise connect_failure(
                    "the result watch could not LISTEN", error, write=False
                ) from error
            yield _AsyncWatch(conn, message_id, self.dead_channel)
        finally:
            await conn.close()
