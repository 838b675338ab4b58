"""PostgreSQL stored results: the lookup, the retention trim, and the source of the hints
a waiting ``broker.result(…, wait=)`` sleeps on (one LISTEN connection per backend, shared
through :class:`~sqlbroker.storage.result_hub.ResultHub`). The values are written by
``message_complete_valued`` (queries.sql), which NOTIFYs the result channel with the
message id in the same commit; dead letters are announced on the dead channel."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import datetime

import psycopg
from psycopg import sql

from sqlbroker.storage.base import AsyncResultWatch, ResultWatch
from sqlbroker.storage.postgres.connection import PostgresPool
from sqlbroker.storage.result_hub import Hint, ResultHub
from sqlbroker.storage.url import redact

log = logging.getLogger("sqlbroker.storage")
_LISTEN_PAUSE = 0.5
"""Seconds between two checks of the stop flag while listening."""


class PostgresResults:
    """Stored-result operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _sql: dict[str, str]
    _result_hub: ResultHub
    result_channel: str
    dead_channel: str

    _now_param: Callable[[], datetime | None]

    def _listen_statement(self) -> sql.Composed:
        return sql.SQL("LISTEN {}; LISTEN {}").format(
            sql.Identifier(self.result_channel), sql.Identifier(self.dead_channel)
        )

    def _result_source(self, hint: Hint, ready: threading.Event, stop: threading.Event) -> None:
        """The result hub's source: LISTEN on a connection of its own, re-established with
        backoff; a stored value's NOTIFY carries its message id, a dead letter's its
        subscription (any waiter may be concerned)."""
        pause = 0.1
        target = self._db.listen_target()
        if target is None:  # behind a transaction pooler: the waiters' own looks alone
            ready.set()
            return
        conninfo, kwargs = target
        while not stop.is_set():
            try:
                with psycopg.Connection.connect(conninfo, **kwargs) as conn:
                    conn.execute(self._listen_statement())
                    pause = 0.1
                    ready.set()
                    # Notifications sent while we were not listening are gone: look again.
                    hint(None)
                    while not stop.is_set():
                        for notice in conn.notifies(timeout=_LISTEN_PAUSE):
                            hint(None if notice.channel == self.dead_channel else notice.payload)
            except psycopg.Error as error:
                log.warning(
                    "the result LISTEN connection failed (%s); retrying in %.1f s",
                    redact(str(error)).strip(),
                    pause,
                )
                stop.wait(pause)
                pause = min(pause * 2, 5.0)

    def result_watch(self, *, message_id: str) -> AbstractContextManager[ResultWatch]:
        return self._result_hub.watch(message_id)

    def result_watch_async(
        self, *, message_id: str
    ) -> AbstractAsyncContextManager[AsyncResultWatch]:
        return self._result_hub.watch_async(message_id)
