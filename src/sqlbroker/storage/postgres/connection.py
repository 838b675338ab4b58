"""PostgreSQL connections: the pools (one for threads, one per event loop), their
connections' liveness, and transactions — ours, or a caller's joined
(:mod:`~sqlbroker.storage.postgres.joining`). Session settings are in
:mod:`~sqlbroker.storage.postgres.options`, error translation in
:mod:`~sqlbroker.storage.postgres.errors`."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from sqlbroker.core.errors import (
    ConnectionLost,
    StorageError,
)
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.plan import StatementFailed
from sqlbroker.storage.postgres.errors import AsyncConn, Conn, connect_failure, translate
from sqlbroker.storage.postgres.joining import CallerConnections
from sqlbroker.storage.postgres.liveness import (
    Watch,
    Watcher,
    check_idle,
    drain,
    sound,
)
from sqlbroker.storage.postgres.loop_pool import LoopPool
from sqlbroker.storage.postgres.options import SessionOptions


class PostgresPool:
    """Autocommit connections from a ``psycopg_pool`` pool per event loop (and one for
    threads), opened on first use, configured by :class:`SessionOptions`.

    Every driver error leaving :meth:`connection` or :meth:`transaction` is translated
    (:func:`~sqlbroker.storage.postgres.errors.translate`); a caller's ``conn=`` is joined
    by :class:`~sqlbroker.storage.postgres.joining.CallerConnections`.
    """

    def __init__(self, options: SessionOptions, *, sql: Mapping[str, str]) -> None:
        self.options = options
        self.sql = sql
        self._pool: ConnectionPool[Conn] | None = None
        self._async_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPool] = (
            weakref.WeakKeyDictionary()
        )
        self._recent: tuple[weakref.ref[asyncio.AbstractEventLoop], LoopPool] | None = None
        """The last loop that asked for its pool, and that pool: its next call takes no
        lock and makes no weak reference (the one of a ``WeakKeyDictionary`` lookup)."""
        self._pool_lock = threading.Lock()
        self._closed = False
        self._watcher = Watcher(options.network_timeout)
        self._callers = CallerConnections(self)

    def _open_pool(self, *, write: bool = True) -> ConnectionPool[Conn]:
        with self._pool_lock:
            if self._closed:
                raise StorageError("the broker is closed")
            if self._pool is None:
                # One direct connection first: it fails fast with the server's own reason
                # (wrong password, no such database), which a pool would only log.
                try:
                    psycopg.connect(
                        self.options.url.raw, **self.options.connection_kwargs()
                    ).close()
                except psycopg.Error as error:
                    raise connect_failure(
                        f"cannot connect to PostgreSQL at {self.options.url}", error, write=write
                    ) from None
                self._pool = ConnectionPool(
                    self.options.url.raw,
                    min_size=1,
                    max_size=self.options.pool_size,
                    kwargs=self.options.connection_kwargs(),
                    timeout=self.options.connect_timeout,
                    name="sqlbroker",
                    open=True,
                )
            return self._pool

    @contextmanager
    def connection(self, *, write: bool, watched: bool = True) -> Iterator[Conn]:
        """A pooled connection; with ``watched``, shut down if it gives no answer within
        ``network_timeout`` (a migration, whose DDL may run long, opts out)."""
        # getconn/putconn rather than the pool's own context manager, which also enters
        # the connection's (a commit that has nothing to do in autocommit): on every
        # statement that is a tenth of a send's client time. A connection returned inside
        # a transaction is still rolled back by the pool.
        pool = self._pool if self._pool is not None else self._open_pool(write=write)
        try:
            conn = pool.getconn()
            for _ in range(self.options.pool_size):
                if sound(conn):
                    break
                # The server ended this session while it sat idle (a restart, a terminated
                # backend): nothing was sent on it, so take another instead of failing.
                conn.close()
                pool.putconn(conn)
                check_idle(pool)
                conn = pool.getconn()
        except psycopg.OperationalError as error:  # PoolTimeout among them
            raise self.not_connected(error, write=write) from None
        self._callers.own(conn)
        watch = self._watcher.watch(conn) if watched else None
        lost = False
        try:
            try:
                yield conn
            except (psycopg.Error, StatementFailed) as error:
                if watch is not None and watch.fired:
                    raise watch.lost(write=write) from None
                raise translate(error, self.options, write=write, conn=conn) from None
            finally:
                if watch is not None:
                    self._watcher.release(conn)
                lost = conn.broken  # also where a plan carried on past it (StatementFailed)
                pool.putconn(conn)
        except ConnectionLost:
            lost = True
            raise
        finally:
            if lost and watch is not None and watch.fired:
                drain(pool)
            elif lost:
                check_idle(pool)

    def not_connected(self, error: psycopg.OperationalError, *, write: bool) -> Exception:
        """The pool gave no connection: nothing was sent, so nothing can have committed."""
        if isinstance(error, PoolTimeout):
            return ConnectionLost(
                f"no PostgreSQL connection within {self.options.connect_timeout:g} s"
                f" (pool of {self.options.pool_size})",
                ambiguous=False,
                write=write,
            )
        return connect_failure("PostgreSQL connection failed", error, write=write)

    @contextmanager
    def transaction(
        self, conn: CallerConnection | None = None, *, watched: bool = True
    ) -> Iterator[Conn]:
        """A transaction on a pooled connection, or the caller's ``conn`` (see
        :mod:`sqlbroker.storage.postgres.joining`) joined in a savepoint. ``watched``
        as for :meth:`connection`: pass ``False`` when the caller's own statements (or a
        bulk statement) run in it; such a transaction of ours is not held to
        ``lock_timeout`` and ``statement_timeout`` either (statement ``untimed``)."""
        if conn is None:
            with self.connection(write=True, watched=watched) as own, own.transaction():
                if not watched:
                    own.execute(self.sql["untimed"])
                yield own
            return
        with self._callers.joined(conn) as raw:
            yield raw

    def connection_async(self, *, write: bool, watched: bool = True) -> AsyncCheckout:
        """:meth:`connection` from the running loop's async pool, opened on first use."""
        return AsyncCheckout(self, write=write, watched=watched)

    @asynccontextmanager
    async def transaction_async(
        self, conn: CallerConnection | None = None, *, watched: bool = True
    ) -> AsyncIterator[AsyncConn]:
        """:meth:`transaction` for an async caller's connection, or (``conn=None``) a
        transaction on a connection of the async pool, opened on first use."""
        if conn is None:
            async with (
                self.connection_async(write=True, watched=watched) as own,
                own.transaction(),
            ):
                if not watched:
                    await own.execute(self.sql["untimed"])
                yield own
            return
        async with self._callers.joined_async(conn) as raw:
            yield raw

    def _loop_pool(self) -> LoopPool:
        """The running loop's connections (:class:`LoopPool`), made on first use. Pools of
        loops that have closed are finished here: ``asyncio.run(broker.send(…))`` one call
        after another leaves at most one loop's connections open."""
        loop = asyncio.get_running_loop()
        recent = self._recent
        if recent is not None and recent[0]() is loop and not self._closed:
            return recent[1]
        with self._pool_lock:
            if self._closed:
                raise StorageError("the broker is closed")
            pool = self._async_pools.get(loop)
            if pool is None:
                for other, stale in list(self._async_pools.items()):
                    if other.is_closed():
                        del self._async_pools[other]
                        stale.finish()
                pool = self._async_pools[loop] = LoopPool(loop, self.options)
            self._recent = (weakref.ref(loop), pool)
            return pool

    async def close_async(self) -> None:
        """Close the calling loop's async pool (the worker calls this before its loop ends)."""
        with self._pool_lock:
            self._recent = None
            pool = self._async_pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    @property
    def blocking_pool_open(self) -> bool:
        """Whether the blocking pool (of threads) was opened and not closed since."""
        return self._pool is not None

    def close(self) -> None:
        """Close the blocking pool and the connections of every loop's pool left open (a
        loop's own ``close_async`` closes its pool properly)."""
        with self._pool_lock:
            self._closed = True
            self._recent = None
            pool, self._pool = self._pool, None
            stale = list(self._async_pools.values())
            self._async_pools.clear()
        for entry in stale:
            entry.finish()
        self._watcher.close()
        if pool is not None:
            pool.close()


class AsyncCheckout:
    """``async with pool.connection_async(...) as conn``: a connection of the running
    loop's pool, given back when the block ends. A class, not an ``asynccontextmanager``:
    that makes an async generator (which the loop registers in a weak set) and two
    coroutines more on every operation of an ``AsyncBroker``."""

    __slots__ = ("_conn", "_db", "_pool", "_watchdog", "_watched", "_write")

    def __init__(self, db: PostgresPool, *, write: bool, watched: bool) -> None:
        self._db = db
        self._write = write
        self._watched = watched

    async def __aenter__(self) -> AsyncConn:
        db, write = self._db, self._write
        pool = self._pool = db._loop_pool()
        try:
            conn = await pool.getconn()  # a sound one: see LoopPool
        except psycopg.OperationalError as error:  # PoolTimeout among them
            if not isinstance(error, PoolTimeout):
                await pool.check()
            raise db.not_connected(error, write=write) from None
        db._callers.own(conn)
        # The worker's claims and acks run here: a connection that gives no answer within
        # network_timeout (a peer gone silent with its TCP session kept alive in between,
        # where keepalives see nothing wrong) is shut down, so the call fails and the pool
        # replaces it instead of the worker waiting for ever.
        self._watchdog = pool.watcher.watch(conn) if self._watched else None
        self._conn = conn
        return conn

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: Any
    ) -> None:
        pool, conn, watchdog, write = self._pool, self._conn, self._watchdog, self._write
        broken = conn.broken  # also where a plan carried on past it (StatementFailed)
        try:
            try:
                if isinstance(error, psycopg.Error | StatementFailed):
                    if watchdog is not None and watchdog.fired:
                        raise watchdog.lost(write=write) from None
                    raise translate(error, self._db.options, write=write, conn=conn) from None
            finally:
                if watchdog is not None:
                    pool.watcher.release(conn)
                await pool.putconn(conn)
        except ConnectionLost:
            await self._lost(pool, watchdog)
            raise
        if broken or isinstance(error, ConnectionLost):
            await self._lost(pool, watchdog)

    @staticmethod
    async def _lost(pool: LoopPool, watchdog: Watch | None) -> None:
        if watchdog is not None and watchdog.fired:
            # Its idle siblings most likely went silent with it, and testing them
            # would wait on the same silence: replace them all.
            await pool.drain()
        else:
            await pool.check()
