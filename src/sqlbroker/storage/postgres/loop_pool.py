"""The connections of one event loop: at most ``pool_size`` open at once, idle ones kept for the
next operation, and no task of its own.

Not psycopg_pool's ``AsyncConnectionPool``: its maintenance tasks live on the loop that
opened it and must be closed there; a loop that ends without that (``asyncio.run`` of one
call after another on a broker never closed) cancels them, and a task cancelled while it
opens a connection swallows the cancellation, so ``asyncio.run`` never returns. With no
task, a loop may end at any time: its connections are then closed by :meth:`LoopPool.finish`,
synchronously (libpq's ``PQfinish``), when the next loop opens its pool, when the broker
closes, or when the loop is collected.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolTimeout

from sqlbroker.storage.postgres.errors import AsyncConn
from sqlbroker.storage.postgres.liveness import LoopWatcher, sound
from sqlbroker.storage.postgres.options import SessionOptions


class LoopPool:
    """An event loop's connections to one database (see the module docstring): at most
    ``pool_size`` of ``options``, ``PoolTimeout`` after ``connect_timeout``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, options: SessionOptions) -> None:
        self.watcher = LoopWatcher(options.network_timeout)
        """Shuts down a connection checked out and silent for ``network_timeout``."""
        self._conninfo = options.url.raw
        self._kwargs = options.connection_kwargs()
        self._timeout = options.connect_timeout
        self._slots = asyncio.Semaphore(options.pool_size)
        self._idle: deque[AsyncConn] = deque()
        self._opened: weakref.WeakSet[AsyncConn] = weakref.WeakSet()
        self._closed = False
        # Holds the idle connections: when the loop goes, they are finished, not dropped
        # open (psycopg warns about a connection deleted while open).
        self._finalizer = weakref.finalize(loop, _finish, self._idle, self._opened)

    async def getconn(self) -> AsyncConn:
        """An idle connection that still looks usable, or a new one; ``PoolTimeout`` when
        ``pool_size`` are in use for ``connect_timeout`` seconds."""
        if self._slots.locked():  # all in use: wait, at most timeout seconds
            try:
                await asyncio.wait_for(self._slots.acquire(), self._timeout)
            except TimeoutError:
                raise PoolTimeout(f"no connection within {self._timeout:g} s") from None
        else:
            await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if sound(conn):
                    return conn
                await conn.close()
            conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._kwargs)
            self._opened.add(conn)
            return conn
        except BaseException:
            self._slots.release()
            raise

    async def putconn(self, conn: AsyncConn) -> None:
        """Give a connection back: kept when it is idle and sound, else closed."""
        try:
            idle = conn.info.transaction_status == TransactionStatus.IDLE
            if self._closed or conn.broken or conn.closed or not idle:
                await conn.close()
            else:
                self._idle.append(conn)
        finally:
            self._slots.release()

    async def check(self) -> None:
        """Close the idle connections that no longer look usable (a restart ended them)."""
        for conn in list(self._idle):
            if not sound(conn):
                self._idle.remove(conn)
                await conn.close()

    async def drain(self) -> None:
        """Close every idle connection (they went silent with one that did)."""
        while self._idle:
            await self._idle.pop().close()

    async def close(self) -> None:
        """Close on the loop: the idle connections now, those in use when given back."""
        self._closed = True
        await self.drain()

    def finish(self) -> None:
        """Close every connection this pool opened, without its loop (gone or stopped)."""
        self._closed = True
        self._finalizer()


def _finish(idle: deque[AsyncConn], opened: weakref.WeakSet[AsyncConn]) -> None:
    for conn in [*idle, *opened]:
        conn.pgconn.finish()
    idle.clear()
