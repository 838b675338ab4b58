"""PostgreSQL connections: the pool, transactions and error translation."""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from sqlbroker.core import validate
from sqlbroker.core.errors import (
    AuthenticationError,
    ConfigurationError,
    ConnectionLost,
    DatabaseBusy,
    InvalidOption,
    SchemaError,
    StorageError,
)
from sqlbroker.storage import caller
from sqlbroker.storage.postgres.adapters import ADAPTERS
from sqlbroker.storage.postgres.liveness import (
    Watchdog,
    Watcher,
    check_idle,
    drain,
    sound,
)
from sqlbroker.storage.postgres.loop_pool import LoopPool
from sqlbroker.storage.url import DatabaseURL, redact

Conn = psycopg.Connection[TupleRow]
AsyncConn = psycopg.AsyncConnection[TupleRow]
T = TypeVar("T")
Statement = tuple[str, Mapping[str, Any]]
StatementPlan = Generator[Statement, list[tuple[Any, ...]], T]

"""The statements of one operation, independent of the driver's I/O: the plan yields each
statement with its parameters and is sent back the rows it returned. The same plan runs on
a sync connection (:func:`run_plan`) or an async one (:func:`run_plan_async`)."""


def returned_rows(cursor: psycopg.Cursor[TupleRow] | psycopg.AsyncCursor[TupleRow]) -> bool:
    """Whether the statement just executed returned rows (``cursor.description`` tells
    too, but builds a column list to do it)."""
    result = cursor.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


def run_plan(conn: Conn, plan: StatementPlan[T]) -> T:
    try:
        statement, params = next(plan)
        while True:
            cursor = conn.execute(statement, params)
            rows = cursor.fetchall() if returned_rows(cursor) else []
            statement, params = plan.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_plan_async(conn: AsyncConn, plan: StatementPlan[T]) -> T:
    try:
        statement, params = next(plan)
        while True:
            cursor = await conn.execute(statement, params)
            rows = await cursor.fetchall() if returned_rows(cursor) else []
            statement, params = plan.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


# A failed connection attempt carries no SQLSTATE (libpq reports it as text), so a refused
# login is told from an unreachable server by the server's message.
_LOGIN_REFUSED = (
    "password authentication failed",
    "authentication failed for user",
    "no pg_hba.conf entry",
    "no password supplied",
    "password is required",
)
_ROLE = 'role "'
_NO_SUCH_DATABASE = 'database "'


def _parameters(url: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(url)
    except psycopg.Error:
        return {}  # a malformed URL fails at connect, with the driver's (redacted) reason


def _milliseconds(seconds: float) -> int:
    """A timeout setting's value: 0 (off) stays 0, anything else at least 1 ms."""
    return 0 if seconds == 0 else max(1, round(seconds * 1000))


def connect_failure(context: str, error: psycopg.Error, *, write: bool = True) -> Exception:
    """The error for a connection that could not be opened (nothing was sent, so nothing
    was applied): a refused login is an :class:`AuthenticationError`, a missing database
    or an unusable connection string a :class:`ConfigurationError` — neither is transient
    and neither is retried — and anything else (server down, network) ``ConnectionLost``."""
    text = " ".join(redact(str(error)).split())
    lowered = text.lower()
    refused = any(marker in lowered for marker in _LOGIN_REFUSED) or (
        _ROLE in lowered and ("does not exist" in lowered or "not permitted to log in" in lowered)
    )
    if refused:
        return AuthenticationError(f"{context}: the server refused the login: {text}")
    if _NO_SUCH_DATABASE in lowered and "does not exist" in lowered:
        return ConfigurationError(f"{context}: {text}")
    if "unsupported startup parameter" in lowered:  # a pooler refusing our session settings
        return ConfigurationError(
            f"{context}: {text} (behind a transaction pooler such as PgBouncer, pass"
            " pooler='transaction'; see docs/reliability.md)"
        )
    if isinstance(error, psycopg.ProgrammingError):  # an invalid connection option
        return ConfigurationError(f"{context}: {text}")
    return ConnectionLost(f"{context}: {text}", ambiguous=False, write=write)


class PostgresPool:
    """Autocommit connections from a ``psycopg_pool`` pool, opened on first use.

    Every driver error leaving :meth:`connection` or :meth:`transaction` is translated:
    a broken connection becomes ``ConnectionLost`` (``ambiguous`` for writes, whose commit
    may or may not have happened), a missing table ``SchemaError``, anything else
    ``StorageError``; passwords are redacted from every message.
    """

    def __init__(
        self,
        url: DatabaseURL,
        *,
        pool_size: int,
        synchronous_commit: str,
        connect_timeout: float,
        application_name: str,
        sql: Mapping[str, str],
        network_timeout: float = 30.0,
        lock_timeout: float | None = None,
        statement_timeout: float | None = None,
        pooler: str | None = None,
        listen_url: DatabaseURL | None = None,
    ) -> None:
        if not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
            raise InvalidOption("pool_size", "must be an integer from 1 to 1000")
        if synchronous_commit not in ("on", "off", "local", "remote_write", "remote_apply"):
            raise InvalidOption(
                "synchronous_commit", "must be on, off, local, remote_write or remote_apply"
            )
        if not isinstance(connect_timeout, int | float) or not 0 < connect_timeout <= 600:
            raise InvalidOption("connect_timeout", "must be seconds, more than 0 and at most 600")
        if (
            not isinstance(network_timeout, int | float)
            or isinstance(network_timeout, bool)
            or not 1 <= network_timeout <= 3600
        ):
            raise InvalidOption("network_timeout", "must be seconds, from 1 to 3600")
        if pooler not in (None, "session", "transaction"):
            raise InvalidOption(
                "pooler",
                "must be None (a direct connection), 'session' or 'transaction' (the pooling"
                " mode of a PgBouncer-like pooler between sqlbroker and PostgreSQL; statement"
                " pooling cannot run sqlbroker's transactions)",
            )
        self.url = url
        self.pooler = pooler
        self.listen_url = listen_url
        # Defaults below network_timeout, so that a wait on a lock held elsewhere (or a
        # statement running long) fails cleanly on the server before the watchdog has to
        # cut the connection, which leaves the outcome unknown.
        self.lock_timeout = (
            network_timeout / 3
            if lock_timeout is None
            else validate.seconds(lock_timeout, "lock_timeout", maximum=3600)
        )
        self.statement_timeout = (
            network_timeout * 2 / 3
            if statement_timeout is None
            else validate.seconds(statement_timeout, "statement_timeout", maximum=3600)
        )
        self._pool_size = pool_size
        self._connect_timeout = float(connect_timeout)
        self.network_timeout = float(network_timeout)
        self._settings = {
            "synchronous_commit": synchronous_commit,
            "application_name": application_name,
        }
        self._sql = sql
        if pooler == "transaction":
            self._check_poolable()
        self._pool: ConnectionPool[Conn] | None = None
        self._async_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPool] = (
            weakref.WeakKeyDictionary()
        )
        self._pool_lock = threading.Lock()
        self._closed = False
        self._watcher = Watcher(self.network_timeout)
        self._identity: tuple[Any, ...] | None = None
        """Our database's :meth:`_identity_of`, read on the first ``conn=``."""
        self._caller_identities: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = (
            weakref.WeakKeyDictionary()
        )
        """Each caller's connection's identity: a session cannot change database, so one
        read per connection object (the cost of a ``conn=`` stays a dictionary lookup)."""

    def connection_kwargs(self) -> dict[str, Any]:
        """Settings for the connections of the pools (through the pooler, if any).

        ``options`` from the URL (e.g. ``?options=-c%20role%3Dsqlbroker_migrator``, so that
        a migration creates objects owned by the migrator group) are kept, ours appended.
        TCP keepalives and ``tcp_user_timeout`` default to values derived from
        ``network_timeout`` (a dead peer is noticed within it), each unless the URL sets it.
        Behind a transaction pooler (``pooler="transaction"``) no session setting travels
        (the pooler refuses the startup ``options``, and a session's settings would stay
        on whichever server connection ran them) and nothing is prepared on the server
        (the next transaction may run on a server connection that never saw it).
        """
        return self._kwargs(self._url_parameters, pooled=self.pooler == "transaction")

    def _check_poolable(self) -> None:
        """Refuse, behind a transaction pooler, the settings that only a session carries."""
        if self._url_parameters.get("options"):
            raise InvalidOption(
                "pooler",
                "a transaction pooler does not pass the URL's options= to the server (and"
                " PgBouncer refuses the connection): set them on the role instead (ALTER ROLE"
                " … SET …), see docs/reliability.md",
            )
        if self._settings["synchronous_commit"] != "on":
            raise InvalidOption(
                "synchronous_commit",
                "cannot be set per session behind a transaction pooler: set it on the role"
                " (ALTER ROLE … SET synchronous_commit = …) and leave this option 'on'",
            )

    def listen_target(self) -> tuple[str, dict[str, Any]] | None:
        """The URL and settings of a LISTEN session: ``listen_url`` when given, else the
        pools' URL — or ``None`` behind a transaction pooler without ``listen_url``, which
        would deliver notifications to whichever client holds the server connection (the
        poll alone then finds new messages)."""
        if self.listen_url is not None:
            return self.listen_url.raw, self._kwargs(_parameters(self.listen_url.raw), pooled=False)
        if self.pooler == "transaction":
            return None
        return self.url.raw, self.connection_kwargs()

    def _kwargs(self, parameters: Mapping[str, Any], *, pooled: bool) -> dict[str, Any]:
        network = {
            name: value
            for name, value in self._network_defaults().items()
            if name not in parameters
        }
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "context": ADAPTERS,
            "connect_timeout": max(1, int(self._connect_timeout)),
            "application_name": self._settings["application_name"],
            **network,
        }
        if pooled:
            kwargs["prepare_threshold"] = None
            return kwargs
        # TimeZone UTC: psycopg then returns times as datetime.UTC, which the claim's row
        # conversion takes as is (another zone costs an astimezone per column and row). No
        # statement depends on the session's zone: times are timestamptz, shown in UTC.
        ours = (
            f"-c synchronous_commit={self._settings['synchronous_commit']} -c TimeZone=UTC"
            f" -c lock_timeout={_milliseconds(self.lock_timeout)}"
            f" -c statement_timeout={_milliseconds(self.statement_timeout)}"
        )
        url_options = parameters.get("options") or ""
        kwargs["options"] = f"{url_options} {ours}" if url_options else ours
        return kwargs

    def _network_defaults(self) -> dict[str, str]:
        """libpq's TCP settings that bound how long a dead peer goes unnoticed: an idle
        connection is probed after a third of ``network_timeout`` and given up after three
        unanswered probes a sixth apart; data sent and not acknowledged within
        ``network_timeout`` closes it (``tcp_user_timeout``, Linux). Unix sockets ignore them.
        """
        timeout = self.network_timeout
        return {
            "keepalives": "1",
            "keepalives_idle": str(max(1, round(timeout / 3))),
            "keepalives_interval": str(max(1, round(timeout / 6))),
            "keepalives_count": "3",
            "tcp_user_timeout": str(int(timeout * 1000)),
        }

    @functools.cached_property
    def _url_parameters(self) -> dict[str, Any]:
        return _parameters(self.url.raw)

    @property
    def conninfo(self) -> str:
        return self.url.raw

    @property
    def synchronous_commit(self) -> str:
        """The sessions' ``synchronous_commit``: how durable a commit is before it returns."""
        return self._settings["synchronous_commit"]

    def _open_pool(self, *, write: bool = True) -> ConnectionPool[Conn]:
        with self._pool_lock:
            if self._closed:
                raise StorageError("the broker is closed")
            if self._pool is None:
                # One direct connection first: it fails fast with the server's own reason
                # (wrong password, no such database), which a pool would only log.
                try:
                    psycopg.connect(self.url.raw, **self.connection_kwargs()).close()
                except psycopg.Error as error:
                    raise connect_failure(
                        f"cannot connect to PostgreSQL at {self.url}", error, write=write
                    ) from None
                self._pool = ConnectionPool(
                    self.url.raw,
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs=self.connection_kwargs(),
                    timeout=self._connect_timeout,
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
            for _ in range(self._pool_size):
                if sound(conn):
                    break
                # The server ended this session while it sat idle (a restart, a terminated
                # backend): nothing was sent on it, so take another instead of failing.
                conn.close()
                pool.putconn(conn)
                check_idle(pool)
                conn = pool.getconn()
        except psycopg.OperationalError as error:  # PoolTimeout among them
            raise self._not_connected(error, write=write) from None
        watch = self._watcher.watch(conn) if watched else None
        try:
            try:
                yield conn
            except psycopg.Error as error:
                if watch is not None and watch.fired:
                    raise watch.lost(write=write) from None
                raise self.translate(error, write=write, conn=conn) from None
            finally:
                if watch is not None:
                    self._watcher.release(conn)
                pool.putconn(conn)
        except ConnectionLost:
            if watch is not None and watch.fired:
                drain(pool)
            else:
                check_idle(pool)
            raise

    def _not_connected(self, error: psycopg.OperationalError, *, write: bool) -> Exception:
        """The pool gave no connection: nothing was sent, so nothing can have committed."""
        if isinstance(error, PoolTimeout):
            return ConnectionLost(
                f"no PostgreSQL connection within {self._connect_timeout:g} s"
                f" (pool of {self._pool_size})",
                ambiguous=False,
                write=write,
            )
        return connect_failure("PostgreSQL connection failed", error, write=write)

    def translate(
        self, error: psycopg.Error, *, write: bool, conn: Conn | AsyncConn | None
    ) -> Exception:
        text = (
            redact(str(error)).strip().splitlines()[0]
            if str(error).strip()
            else type(error).__name__
        )
        if isinstance(error, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
            return SchemaError(
                f"the sqlbroker schema is missing or old ({text}); run `sqlbroker migrate`"
            )
        if isinstance(error, psycopg.errors.InsufficientPrivilege):
            return StorageError(
                f"PostgreSQL refused: {text} (the connecting role lacks this right; the roles"
                " and their grants are in docs/security.md)"
            )
        if isinstance(error, psycopg.errors.LockNotAvailable):
            return DatabaseBusy(
                f"PostgreSQL: a lock was held by another session longer than lock_timeout"
                f" ({self.lock_timeout:g} s); nothing was changed, try again: {text}"
            )
        if isinstance(error, psycopg.errors.QueryCanceled) and "statement timeout" in text:
            return DatabaseBusy(
                f"PostgreSQL: the statement ran longer than statement_timeout"
                f" ({self.statement_timeout:g} s); nothing was changed, try again: {text}"
            )
        broken = (
            conn is None
            or conn.broken
            or isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
        )
        if broken and not isinstance(error, psycopg.errors.QueryCanceled):
            return ConnectionLost(
                f"lost the PostgreSQL connection: {text}", ambiguous=write, write=write
            )
        return StorageError(f"PostgreSQL error: {text}")

    @contextmanager
    def transaction(self, conn: Any = None, *, watched: bool = True) -> Iterator[Conn]:
        """A transaction on a pooled connection, or the caller's ``conn`` (see
        :mod:`sqlbroker.storage.caller`) joined as :meth:`_joined` explains. ``watched``
        as for :meth:`connection`: pass ``False`` when the caller's own statements (or a
        bulk statement) run in it; such a transaction of ours is not held to
        ``lock_timeout`` and ``statement_timeout`` either (statement ``untimed``)."""
        if conn is None:
            with self.connection(write=True, watched=watched) as own, own.transaction():
                if not watched:
                    own.execute(self._sql["untimed"])
                yield own
            return
        raw = self._caller(caller.unwrap, conn)
        if not isinstance(raw, psycopg.Connection):
            raise InvalidOption(
                "conn",
                "a PostgreSQL broker needs a psycopg 3 connection (or SQLAlchemy / Django"
                f" over psycopg 3), not {caller.describe(raw)}",
            )
        # Only a transaction of our own commits here; a connection lost inside the
        # caller's transaction takes that transaction with it, so nothing was applied.
        ours = raw.autocommit and raw.info.transaction_status == TransactionStatus.IDLE
        try:
            self._check_same_database(raw)
            with self._joined(raw):
                yield raw
        except psycopg.Error as error:
            raise self.translate(error, write=ours, conn=raw) from None

    def _check_same_database(self, raw: Conn) -> None:
        """Refuse a caller's connection to another database (or server, or whose
        search_path finds other sqlbroker tables): the message would land there."""
        theirs = self._caller_identities.get(raw)
        if theirs is None:
            self._caller_status(raw)  # a failed transaction would refuse the read
            theirs = self._identity_of(raw)
            self._caller_identities[raw] = theirs
        if theirs == self._identity:
            return
        # Ours is read again before refusing: a restart or a failover changes it.
        with self.connection(write=False) as own:
            self._identity = self._identity_of(own)
        self._refuse_other_database(theirs)

    async def _check_same_database_async(self, raw: AsyncConn) -> None:
        """:meth:`_check_same_database` for an async caller's connection."""
        theirs = self._caller_identities.get(raw)
        if theirs is None:
            self._caller_status(raw)
            cursor = await raw.execute(self._sql["connection_identity"])
            theirs = tuple(await cursor.fetchone() or ())
            self._caller_identities[raw] = theirs
        if theirs == self._identity:
            return
        # A connection of its own, not the loop's pool: a caller's loop (AsyncBroker's
        # publish) has none, and one opened here would outlive the loop.
        try:
            own = await psycopg.AsyncConnection.connect(self.url.raw, **self.connection_kwargs())
        except psycopg.OperationalError as error:
            raise self._not_connected(error, write=False) from None
        async with own:
            cursor = await own.execute(self._sql["connection_identity"])
            self._identity = tuple(await cursor.fetchone() or ())
        self._refuse_other_database(theirs)

    def _identity_of(self, conn: Conn) -> tuple[Any, ...]:
        return tuple(conn.execute(self._sql["connection_identity"]).fetchone() or ())

    def _refuse_other_database(self, theirs: tuple[Any, ...]) -> None:
        ours = self._identity
        if theirs == ours:
            return
        assert ours is not None
        if theirs[0] != ours[0]:
            where = f"database {theirs[0]!r}, not to this broker's {ours[0]!r}"
        elif theirs[1] != ours[1]:
            where = f"database {theirs[0]!r} of another server than this broker's"
        else:
            where = (
                f"database {theirs[0]!r}, but its search_path finds other sqlbroker tables"
                " than this broker's (or none): set the same search_path or schema"
            )
        raise InvalidOption("conn", f"is connected to {where} ({self.url})")

    @contextmanager
    def _joined(self, raw: Conn) -> Iterator[None]:
        """Our statements inside the caller's transaction, which we never commit or roll
        back: a savepoint undoes just our part when we fail (an ``IdempotencyConflict``
        after other keys were reserved), leaving the caller's transaction usable. In
        autocommit with no transaction open, each statement would commit on its own, so we
        wrap ours in a transaction of our own — what autocommit means for one publish."""
        status = self._caller_status(raw)
        if raw.autocommit and status == TransactionStatus.IDLE:
            with raw.transaction():
                yield
            return
        raw.execute(self._sql["savepoint"])
        try:
            yield
        except BaseException:
            if not raw.broken and raw.info.transaction_status != TransactionStatus.UNKNOWN:
                raw.execute(self._sql["savepoint_rollback"])
            raise
        raw.execute(self._sql["savepoint_release"])

    @asynccontextmanager
    async def connection_async(
        self, *, write: bool, watched: bool = True
    ) -> AsyncIterator[AsyncConn]:
        """:meth:`connection` from the running loop's async pool, opened on first use."""
        pool = self._loop_pool()
        try:
            conn = await pool.getconn()  # a sound one: see LoopPool
        except psycopg.OperationalError as error:  # PoolTimeout among them
            if not isinstance(error, PoolTimeout):
                await pool.check()
            raise self._not_connected(error, write=write) from None
        # The worker's claims and acks run here: a connection that gives no answer within
        # network_timeout (a peer gone silent with its TCP session kept alive in between,
        # where keepalives see nothing wrong) is shut down, so the call fails and the pool
        # replaces it instead of the worker waiting for ever.
        watchdog = Watchdog(conn, self.network_timeout) if watched else None
        try:
            try:
                yield conn
            except psycopg.Error as error:
                if watchdog is not None and watchdog.fired:
                    raise watchdog.lost(write=write) from None
                raise self.translate(error, write=write, conn=conn) from None
            finally:
                if watchdog is not None:
                    watchdog.cancel()
                await pool.putconn(conn)
        except ConnectionLost:
            if watchdog is not None and watchdog.fired:
                # Its idle siblings most likely went silent with it, and testing them
                # would wait on the same silence: replace them all.
                await pool.drain()
            else:
                await pool.check()
            raise

    @asynccontextmanager
    async def transaction_async(
        self, conn: Any = None, *, watched: bool = True
    ) -> AsyncIterator[AsyncConn]:
        """:meth:`transaction` for an async caller's connection, or (``conn=None``) a
        transaction on a connection of the async pool, opened on first use."""
        if conn is None:
            async with (
                self.connection_async(write=True, watched=watched) as own,
                own.transaction(),
            ):
                if not watched:
                    await own.execute(self._sql["untimed"])
                yield own
            return
        try:
            raw = await caller.unwrap_async(conn)
        except psycopg.Error as error:
            raise self.translate(error, write=True, conn=None) from None
        if not isinstance(raw, psycopg.AsyncConnection):
            raise InvalidOption(
                "conn",
                "an async publish on PostgreSQL needs a psycopg.AsyncConnection (or"
                f" SQLAlchemy's asyncio over psycopg 3), not {caller.describe(raw)}",
            )
        ours = False
        try:
            await self._check_same_database_async(raw)
            status = self._caller_status(raw)
            if raw.autocommit and status == TransactionStatus.IDLE:
                ours = True
                async with raw.transaction():
                    yield raw
                return
            await raw.execute(self._sql["savepoint"])
            try:
                yield raw
            except BaseException:
                if not raw.broken and raw.info.transaction_status != TransactionStatus.UNKNOWN:
                    await raw.execute(self._sql["savepoint_rollback"])
                raise
            await raw.execute(self._sql["savepoint_release"])
        except psycopg.Error as error:
            raise self.translate(error, write=ours, conn=raw) from None

    def _caller(self, unwrap: Callable[[Any], Any], conn: Any) -> Any:
        try:
            return unwrap(conn)
        except psycopg.Error as error:
            raise self.translate(error, write=True, conn=None) from None

    @staticmethod
    def _caller_status(raw: Conn | AsyncConn) -> TransactionStatus:
        if raw.closed:
            raise InvalidOption("conn", "is closed")
        status = raw.info.transaction_status
        if status == TransactionStatus.INERROR:
            raise InvalidOption("conn", "is in a failed transaction; roll it back first")
        if status == TransactionStatus.ACTIVE:
            raise InvalidOption("conn", "is running another statement")
        if status == TransactionStatus.UNKNOWN:
            raise ConnectionLost("the caller's PostgreSQL connection is broken", ambiguous=False)
        return status

    def _loop_pool(self) -> LoopPool:
        """The running loop's connections (:class:`LoopPool`), made on first use. Pools of
        loops that have closed are finished here: ``asyncio.run(broker.send(…))`` one call
        after another leaves at most one loop's connections open."""
        loop = asyncio.get_running_loop()
        with self._pool_lock:
            if self._closed:
                raise StorageError("the broker is closed")
            pool = self._async_pools.get(loop)
            if pool is None:
                for other, stale in list(self._async_pools.items()):
                    if other.is_closed():
                        del self._async_pools[other]
                        stale.finish()
                pool = self._async_pools[loop] = LoopPool(
                    loop,
                    conninfo=self.url.raw,
                    kwargs=self.connection_kwargs(),
                    size=self._pool_size,
                    timeout=self._connect_timeout,
                )
            return pool

    async def close_async(self) -> None:
        """Close the calling loop's async pool (the worker calls this before its loop ends)."""
        with self._pool_lock:
            pool = self._async_pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def close(self) -> None:
        """Close the blocking pool and the connections of every loop's pool left open (a
        loop's own ``close_async`` closes its pool properly)."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
            stale = list(self._async_pools.values())
            self._async_pools.clear()
        for entry in stale:
            entry.finish()
        self._watcher.close()
        if pool is not None:
            pool.close()
