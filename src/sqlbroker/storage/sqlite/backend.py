"""SQLite backend: stdlib ``sqlite3``, WAL, every write in ``BEGIN IMMEDIATE``.

Several processes on one host can share a database file: SQLite serializes writers and
``busy_timeout`` makes them wait instead of failing. Network filesystems are refused because
their locking cannot be trusted. Connections are pooled and handed to one thread at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import InvalidOption, StorageError
from sqlbroker.core.limits import Limits
from sqlbroker.storage import caller
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.columns import utc
from sqlbroker.storage.plan import COMMIT_POINT, Access, Plan, Rows
from sqlbroker.storage.result_hub import Hint, ResultHub
from sqlbroker.storage.seam import AsyncTx, Settings
from sqlbroker.storage.sql import load_sql
from sqlbroker.storage.sqlite import dialect
from sqlbroker.storage.sqlite.connection import SESSION, SqlitePool
from sqlbroker.storage.sqlite.threads import THREADS, HeldTransaction
from sqlbroker.storage.threads import OwnThreads
from sqlbroker.storage.url import DatabaseURL

log = logging.getLogger("sqlbroker.storage")
T = TypeVar("T")
_WATCH_MIN = 0.002
_WATCH_MAX = 0.05


class SqliteBackend(Backend):
    name = "sqlite"
    supports_notify = False
    notify_channel = ""
    schema_files = dialect.SCHEMA
    _db: SqlitePool

    def __init__(
        self,
        url: DatabaseURL,
        *,
        clock: Clock,
        synchronous: str = "full",
        durable_claims: bool = False,
        archive_completed: bool = True,
        busy_timeout: float = 30.0,
        pool_size: int = 8,
        limits: Limits | None = None,
    ) -> None:
        assert url.path is not None
        # Whether a claim's own commit waits for the fsync: see SqlitePool.write.
        self._flush_claims = validate.flag(durable_claims, "durable_claims")
        self._archive_completed = validate.flag(archive_completed, "archive_completed")
        super().__init__(url, clock=clock, limits=limits)
        self._db = SqlitePool(
            url.path, synchronous=synchronous, busy_timeout=busy_timeout, pool_size=pool_size
        )
        self._sql = load_sql("sqlbroker.storage.sqlite")
        self._statements = dialect.split(self._sql)
        self._loop_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._threads = OwnThreads(name="sqlbroker-sqlite", size=THREADS)
        self._use(
            Settings(
                dialect="sqlite",
                limits=self.limits,
                clock=clock,
                archive_completed=self._archive_completed,
                one_writer=True,
            )
        )
        self.result_hub = ResultHub(self._result_source)

    # --- the seam ----------------------------------------------------------------------------

    def execute(self, plan: Plan[T], access: Access) -> T:
        """Run one operation in a write transaction of its own (a read in none)."""
        if access.read_only:
            with self._db.connection() as conn:
                return dialect.run(conn, self._statements, plan, self._now())
        flush = self._flush_claims or not access.relaxed
        now = self._now()
        with self._db.write(flush=flush) as conn:
            step = dialect.stepper(conn, self._statements, now)
            try:
                statement = next(plan)
                while statement.block != COMMIT_POINT:
                    statement = plan.send(step(statement))
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        # Committed at the plan's commit point: the rest runs outside the write lock (a
        # claim's decoding, while another thread writes), a statement in a transaction of
        # its own (a claim's undecodable rows, dead-lettered).
        try:
            statement = plan.send(Rows([], 0))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        with self._db.write(committed=True) as conn:
            step = dialect.stepper(conn, self._statements, now)
            while True:
                try:
                    statement = plan.send(step(statement))
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]

    async def _execute_async(self, plan: Plan[T], access: Access) -> T:
        """:meth:`execute` on one of the backend's threads."""
        return await self._threads.run(functools.partial(self.execute, plan, access))

    def _transaction(
        self, conn: CallerConnection | None, *, timed: bool
    ) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction: ours (``BEGIN IMMEDIATE``), or the caller's joined as a
        savepoint. (``timed`` is PostgreSQL's: SQLite's statements are bounded by
        ``busy_timeout``.)"""
        return self._db.write(conn)

    def _run_on(self, conn: sqlite3.Connection, plan: Plan[T]) -> T:
        return dialect.run(conn, self._statements, plan, self._now())

    @contextlib.asynccontextmanager
    async def begin_async(
        self, conn: CallerConnection | None = None, *, timed: bool = True
    ) -> AsyncIterator[AsyncTx]:
        """:meth:`begin` for coroutines: the transaction is held by one of the backend's
        threads, which runs each operation; the loop never blocks on SQLite. SQLite has
        no async driver, so a caller's ``conn`` is refused."""
        if conn is not None:
            raise InvalidOption(
                "conn",
                "SQLite has no async connections: pass the sqlite3.Connection itself, to"
                f" Broker (not {caller.describe(conn)})",
            )
        # The transaction lives on a thread of our own (HeldTransaction), one per
        # coroutine: two coroutines of one loop queue on an asyncio lock rather than hold
        # two threads, the second waiting on the write lock for the first.
        lock = self._loop_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:
            held = HeldTransaction(self._threads, self._db.write)
            raw = await held.enter()

            async def run(plan: Plan[Any]) -> Any:
                return await held.call(functools.partial(self._run_on, raw, plan))

            try:
                yield AsyncTx(self._tx_settings, run, raw)
            except BaseException:
                await held.leave(commit=False)
                raise
            await held.leave(commit=True)

    def _now(self) -> float:
        now = self._clock.now()
        return time.time() if now is None else now.timestamp()

    def now(self) -> datetime:
        return utc(self._now())

    async def listen_async(
        self,
        *,
        on_hint: Callable[[str | None], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        # Cancels are not announced here: workers look for them (runtime/executing.py).
        # sqlite3 blocks: the watch runs in a thread of its own and hands hints to the loop.
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def hint(subscription: str | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(on_hint, subscription)

        watcher = threading.Thread(
            target=self._watch, args=(hint, stop), name="sqlbroker-listen", daemon=True
        )
        watcher.start()
        try:
            await loop.create_future()  # until cancelled
        finally:
            # Not joined: a look in progress ends on its own within one pause.
            stop.set()

    def _watch(self, on_hint: Callable[[str | None], None], stop: threading.Event) -> None:
        if self._db.memory:
            # One process, one connection: nothing else can write. Holding the only
            # connection to watch it would starve every other operation.
            stop.wait()
            return
        last: int | None = None
        while not stop.is_set():
            try:
                with self._db.dedicated() as conn:
                    # Look often while commits keep coming, rarely when the file is quiet:
                    # 2 ms after a change, doubling to 50 ms. A look costs microseconds.
                    pause = _WATCH_MIN
                    while not stop.is_set():
                        version = conn.execute(SESSION["session_data_version"]).fetchone()[0]
                        if version != last:
                            last = version
                            pause = _WATCH_MIN
                            on_hint(None)
                        else:
                            pause = min(pause * 2, _WATCH_MAX)
                        stop.wait(pause)
            except StorageError as error:
                log.warning("watching the SQLite database for changes failed: %s", error)
                stop.wait(1.0)

    def _result_source(self, hint: Hint, ready: threading.Event, stop: threading.Event) -> None:
        """The result hub's source: the ``PRAGMA data_version`` watcher; every commit of
        any connection or process may have finished a waited-for copy."""
        ready.set()  # its first look hints anyway: nothing committed before it is missed
        self._watch(lambda _subscription: hint(None), stop)

    # --- schema ------------------------------------------------------------------------------

    def _migrating(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._db.write()

    def _run_script(self, conn: sqlite3.Connection, script: str) -> None:
        for statement in dialect.statements(script):
            conn.execute(statement)

    @staticmethod
    def schema_sql() -> str:
        """The complete schema script, version rows included (``sqlbroker schema --print``)."""
        return dialect.SCHEMA.script()

    # --- consuming ---------------------------------------------------------------------------

    async def close_async(self) -> None:
        self._loop_locks.pop(asyncio.get_running_loop(), None)
        self._threads.shutdown()
