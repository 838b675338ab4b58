"""The SQLite backend's own threads for its async operations.

``sqlite3`` blocks: an event loop that called it directly would stall on the write lock, on
``busy_timeout`` and on the commit's fsync. The backend's coroutines therefore run their
SQLite work on a small pool of named threads of their own
(:class:`~sqlbroker.storage.threads.OwnThreads`: not the loop's default executor, which
user code shares), created on first use and shut down on close.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlbroker.storage.threads import OwnThreads

T = TypeVar("T")

THREADS = 4
"""At most this many of the backend's operations run at once (claims, held transactions)."""


class _Rollback(Exception):
    """Raised inside a held transaction to leave it by rolling back."""


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


class HeldTransaction:
    """A write transaction held by one thread of the pool on behalf of a coroutine.

    The process's SQLite write lock is a thread's lock (``SqlitePool.write``): the thread
    that begins the transaction must end it. So one thread enters it, runs the statements
    the coroutine sends it (:meth:`call`: the ack inside the transaction) and then commits
    or rolls back (:meth:`leave`), while the coroutine uses the connection between those
    steps from the loop. The loop waits on none of it.
    """

    def __init__(
        self,
        threads: OwnThreads,
        begin: Callable[[], AbstractContextManager[sqlite3.Connection]],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._begin = begin
        self._requests: queue.SimpleQueue[Callable[[], None] | bool] = queue.SimpleQueue()
        self._entered: asyncio.Future[sqlite3.Connection] = self._loop.create_future()
        self._done = threads.run(self._hold)
        # Whoever awaits it sees its failure; if nobody does (a cancelled coroutine), it
        # must not be reported as never retrieved.
        self._done.add_done_callback(_retrieved)

    def _reply(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        self._loop.call_soon_threadsafe(_settle, future, result, error)

    def _hold(self) -> None:
        with self._begin() as conn:
            self._reply(self._entered, conn, None)
            while True:
                request = self._requests.get()
                if request is True:
                    return
                if request is False:
                    raise _Rollback
                request()

    async def enter(self) -> sqlite3.Connection:
        """The transaction's connection, once the thread has begun it."""
        waiting: set[asyncio.Future[Any]] = {self._entered, self._done}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # Cancelled while waiting: the thread may still begin; have it roll back then.
            self._requests.put(False)
            raise
        if not self._entered.done():
            self._done.result()  # the failure to begin (DatabaseBusy, StorageError, …)
        return self._entered.result()

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the transaction's thread, inside the transaction."""
        future: asyncio.Future[T] = self._loop.create_future()

        def run() -> None:
            try:
                result = fn()
            except BaseException as error:
                self._reply(future, None, error)
            else:
                self._reply(future, result, None)

        self._requests.put(run)
        return await future

    async def leave(self, *, commit: bool) -> None:
        """Commit (or roll back) on the thread and wait for it; a failed commit raises."""
        self._requests.put(commit)
        with contextlib.suppress(_Rollback):
            await self._done


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
