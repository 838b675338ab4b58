"""SQLite stored results: the lookup, the retention trim, and the source of the hints a
waiting ``broker.result(…, wait=)`` sleeps on — one ``PRAGMA data_version`` watcher per
backend (shared through :class:`~sqlbroker.storage.result_hub.ResultHub`), which sees every
commit of every connection and process. Values are written by ``message_settle_many``
(backend.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager

from sqlbroker.storage.base import AsyncResultWatch, ResultWatch
from sqlbroker.storage.result_hub import Hint, ResultHub
from sqlbroker.storage.sqlite.connection import SqlitePool


class SqliteResults:
    """Stored-result operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool
    _sql: dict[str, str]
    _result_hub: ResultHub

    _now: Callable[[], float]

    _watch: Callable[[Callable[[str | None], None], threading.Event], None]

    def _result_source(self, hint: Hint, ready: threading.Event, stop: threading.Event) -> None:
        """The result hub's source: the ``PRAGMA data_version`` watcher; every commit of
        any connection or process may have finished a waited-for copy."""
        ready.set()  # its first look hints anyway: nothing committed before it is missed
        self._watch(lambda _subscription: hint(None), stop)

    def result_watch(self, *, message_id: str) -> AbstractContextManager[ResultWatch]:
        return self._result_hub.watch(message_id)

    def result_watch_async(
        self, *, message_id: str
    ) -> AbstractAsyncContextManager[AsyncResultWatch]:
        return self._result_hub.watch_async(message_id)
