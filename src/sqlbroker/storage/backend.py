"""What a backend is: the queue operations of :class:`~sqlbroker.storage.seam.Executor`
(each written once, in :mod:`sqlbroker.storage.operations`), the transactions they join,
and the lifecycle around them.

Every backend subclasses :class:`Backend` and passes the seam's conformance suite
(``tests/seam``) on its own dialect. What differs between databases is data in the
dialect (its SQL blocks, encodings, :class:`~sqlbroker.storage.schema.SchemaFiles`) or a
capability flag (``supports_notify``), never an ``isinstance`` check above this layer. The
few rules written here hold for every backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlbroker.core.clock import Clock
from sqlbroker.core.limits import Limits
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.operations import schema
from sqlbroker.storage.operations.subscriptions import KnownQueues
from sqlbroker.storage.plan import Access, Plan
from sqlbroker.storage.result_hub import ResultHub, Waiter
from sqlbroker.storage.schema import SchemaFiles, pending
from sqlbroker.storage.seam import AsyncExecutor, AsyncTx, Executor, Settings, Tx
from sqlbroker.storage.threads import OwnThreads
from sqlbroker.storage.url import DatabaseURL

T = TypeVar("T")


class Pool(Protocol):
    """A dialect's connections to its database (``SqlitePool``, ``PostgresPool``)."""

    def close(self) -> None:
        """Close them (one in use when it is given back); no new one is handed out."""


class Backend(Executor):
    """Queue operations over one database. Thread-safe; blocking (every operation as a
    coroutine: :attr:`async_ops`)."""

    name: str
    supports_notify: bool
    notify_channel: str
    limits: Limits
    async_ops: AsyncExecutor
    """Every operation as a coroutine (PostgreSQL: on the running loop's async pool;
    SQLite: on the backend's own threads)."""
    schema_files: SchemaFiles
    """The dialect's schema (its migrations, what to tell an operator)."""
    result_hub: ResultHub
    """The one source of result hints every waiting ``broker.result`` shares."""
    _threads: OwnThreads
    """The backend's own threads (:meth:`offload`; SQLite's coroutines run on them)."""
    _db: Pool
    _qualifier = ""
    """The prefix naming the tables' schema in SQL (PostgreSQL's ``schema``; empty: none)."""

    def __init__(self, url: DatabaseURL, *, clock: Clock, limits: Limits | None) -> None:
        self._url = url
        self._clock = clock
        self.limits = limits or Limits()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._url!s})"

    def _use(self, settings: Settings) -> None:
        """Run every operation under ``settings``: one-off operations (:attr:`settings`,
        :attr:`async_ops`) learn the queues they create; transactions of several (the
        caller's, :meth:`begin`'s) may roll back what they created, so they learn none."""
        known = KnownQueues()
        self.settings = dataclasses.replace(settings, known_queues=known)
        self._tx_settings = dataclasses.replace(settings, known_queues=known.in_transactions())
        self.async_ops = AsyncOps(self.settings, self._execute_async)

    @abstractmethod
    async def _execute_async(self, plan: Plan[T], access: Access) -> T:
        """:meth:`execute` as a coroutine: how :attr:`async_ops` runs an operation."""

    @contextlib.contextmanager
    def begin(self, conn: CallerConnection | None = None, *, timed: bool = True) -> Iterator[Tx]:
        """One transaction for several operations, each a method of the ``Tx``: the
        backend's own (committed when the block ends normally, rolled back otherwise), or
        with ``conn`` the caller's connection, joined as a savepoint, never committed.
        ``timed=False``: not held to the sessions' lock and statement timeouts
        (PostgreSQL; a caller's own statements or a bulk write run in it)."""
        with self._transaction(conn, timed=timed) as raw:
            yield Tx(self._tx_settings, functools.partial(self._run_on, raw), raw)

    @abstractmethod
    def begin_async(
        self, conn: CallerConnection | None = None, *, timed: bool = True
    ) -> AbstractAsyncContextManager[AsyncTx]:
        """:meth:`begin` for coroutines."""

    @abstractmethod
    def _transaction(
        self, conn: CallerConnection | None, *, timed: bool
    ) -> AbstractContextManager[Any]:
        """:meth:`begin`'s transaction: the driver connection it holds open."""

    @abstractmethod
    def _run_on(self, conn: Any, plan: Plan[T]) -> T:
        """Run ``plan`` on ``conn``, inside the transaction open there."""

    # --- lifecycle -------------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply pending migrations (serialized across processes); return those applied."""
        migrations = self.schema_files.migrations(self._qualifier)
        # A runtime role (no DDL rights) may call this too, e.g. Broker(migrate=True): on a
        # current schema it must stay a read, so look before taking the lock.
        if self.schema_version() >= len(migrations):
            return []
        applied: list[int] = []
        with self._migrating() as conn:
            current = self._run_on(conn, schema.schema_version_table(self.settings))
            for version, name, script in pending(migrations, current):
                self._run_script(conn, script)
                record = schema.schema_version_record(self.settings, version=version, name=name)
                self._run_on(conn, record)
                applied.append(version)
        return applied

    @abstractmethod
    def _migrating(self) -> AbstractContextManager[Any]:
        """The connection :meth:`migrate` runs on, in a transaction that no concurrent
        migrator shares (the second waits, then finds nothing to do)."""

    @abstractmethod
    def _run_script(self, conn: Any, script: str) -> None:
        """Run one migration's script (its statements, in order) on ``conn``."""

    def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly the version this code needs."""
        self.schema_files.check(self.schema_version())

    @abstractmethod
    def now(self) -> datetime:
        """The storage clock's current time."""

    def close(self) -> None:
        """Let go of everything the backend holds: the result hub's source, the backend's
        own threads, its connections."""
        self.result_hub.close()
        self._threads.shutdown()
        self._db.close()

    @abstractmethod
    async def close_async(self) -> None:
        """Let go of what the backend holds for the running event loop."""

    async def aclose(self) -> None:
        """:meth:`close` from a coroutine: the running loop's connections closed on the
        loop (:meth:`close_async`), then the rest — on the loop when nothing of it blocks,
        else on the backend's own threads (:meth:`offload`)."""
        await self.close_async()
        if self._close_blocks():
            await self.offload(self.close)
        else:
            self.close()

    def _close_blocks(self) -> bool:
        """Whether :meth:`close` would block (wait for threads, disk or network)."""
        return True

    def offload(self, fn: Callable[[], T]) -> Awaitable[T]:
        """Run the blocking ``fn`` from a coroutine on the backend's own threads (never
        on the loop's default executor, which is the application's): what has no
        coroutine form (a migration, the sagas' sweep, closing SQLite's connections)."""
        return self._threads.run(fn)

    @abstractmethod
    async def listen_async(
        self,
        *,
        on_hint: Callable[[str | None], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        """Run until cancelled, calling ``on_hint(subscription)`` on the running loop when
        new work may be claimable there (``None``: anywhere), and (where the backend can
        announce them: PostgreSQL) ``on_cancel(subscription)`` when a running copy there
        was cancelled. Hints can be lost; callers poll as well.

        PostgreSQL: LISTEN/NOTIFY on a dedicated async connection, re-established with
        backoff, with ``on_hint(None)`` after every (re)connect. SQLite: ``PRAGMA
        data_version`` watched every 2 to 50 ms from a thread (more often while commits
        keep coming), which sees commits from every connection and process.
        """

    # --- rules every backend shares ---------------------------------------------------------
    def result_watch(self, *, message_id: str) -> AbstractContextManager[Waiter]:
        """Hints that copies of ``message_id`` may have finished, from one source per
        backend shared by every waiter (:attr:`result_hub`). PostgreSQL: LISTEN on the
        result channel (a value stored for this message) and the dead-letter channel;
        SQLite: the ``PRAGMA data_version`` watcher (any commit). When the block is entered
        the source listens (or gave up for now: the caller's fallback look covers it)."""
        return self.result_hub.watch(message_id)


class AsyncOps(AsyncExecutor):
    """A backend's operations as coroutines, each run by ``execute`` (the backend's: on
    the running loop's pool, or on one of its threads)."""

    def __init__(
        self, settings: Settings, execute: Callable[[Plan[Any], Access], Coroutine[Any, Any, Any]]
    ) -> None:
        self.settings = settings
        self._execute = execute

    def execute(self, plan: Plan[T], access: Access) -> Coroutine[Any, Any, T]:
        # The backend's coroutine itself, not one awaiting it: one coroutine less per call.
        return self._execute(plan, access)
