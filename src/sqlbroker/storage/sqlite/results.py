"""SQLite stored results: the lookup, the retention trim, and the watch a waiting
``broker.result(…, wait=)`` sleeps on — the backend's ``PRAGMA data_version`` watcher,
which sees every commit of every connection and process (values are written by
``message_complete_many``, see backend.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from sqlbroker.core.results import ResultRecord
from sqlbroker.storage.columns import utc
from sqlbroker.storage.sqlite.connection import SqlitePool


class _Watch:
    def __init__(self) -> None:
        self.changed = threading.Event()

    def hint(self, _subscription: str | None) -> None:
        self.changed.set()

    def wait(self, timeout: float) -> bool:
        woke = self.changed.wait(timeout)
        self.changed.clear()
        return woke


class _AsyncWatch:
    def __init__(self) -> None:
        self.changed = asyncio.Event()

    def hint(self, _subscription: str | None) -> None:
        self.changed.set()

    async def wait(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self.changed.wait()
        except TimeoutError:
            return False
        finally:
            self.changed.clear()
        return True


class SqliteResults:
    """Stored-result operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool
    _sql: dict[str, str]

    def _now(self) -> float:
        raise NotImplementedError

    def _watch(self, on_hint: Callable[[str | None], None], stop: threading.Event) -> None:
        raise NotImplementedError

    async def listen_async(self, *, on_hint: Callable[[str | None], None]) -> None:
        raise NotImplementedError

    def result_lookup(self, *, message_id: str) -> list[ResultRecord]:
        with self._db.read() as conn:
            rows = conn.execute(self._sql["result_lookup"], {"message_id": message_id}).fetchall()
        return [_record(row) for row in rows]

    def result_trim(self, *, ttl: float, limit: int) -> int:
        with self._db.write() as conn:
            return conn.execute(
                self._sql["result_trim"], {"now": self._now(), "ttl": ttl, "limit": limit}
            ).rowcount

    @contextmanager
    def result_watch(self, *, message_id: str) -> Iterator[_Watch]:
        watch = _Watch()
        stop = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(watch.hint, stop), name="sqlbroker-result", daemon=True
        )
        watcher.start()
        try:
            yield watch
        finally:
            # Not joined: a look in progress ends on its own within one pause.
            stop.set()

    @asynccontextmanager
    async def result_watch_async(self, *, message_id: str) -> AsyncIterator[_AsyncWatch]:
        watch = _AsyncWatch()
        listener = asyncio.ensure_future(self.listen_async(on_hint=watch.hint))
        try:
            yield watch
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener


def _record(row: Any) -> ResultRecord:
    return ResultRecord(
        subscription=row[0],
        kind=row[1],
        value=None if row[2] is None else bytes(row[2]),
        reason=row[3],
        error_type=row[4],
        error_message=row[5],
        traceback=row[6],
        finished_at=None if row[7] is None else utc(row[7]),
    )
