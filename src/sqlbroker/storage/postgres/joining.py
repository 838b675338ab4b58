"""A caller's own connection (``conn=``) joined into sqlbroker's statements.

The caller's transaction is never committed or rolled back here: our statements run in a
savepoint, which undoes just our part when we fail (an ``IdempotencyConflict`` after other
keys were reserved), leaving the caller's transaction usable. In autocommit with no
transaction open, each statement would commit on its own, so ours are wrapped in a
transaction of our own — what autocommit means for one publish. A connection to another
database (or server, or whose search_path finds other sqlbroker tables) is refused: the
message would land there.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from sqlbroker.core.errors import ConnectionLost, InvalidOption
from sqlbroker.storage import caller
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.postgres.errors import AsyncConn, Conn, translate

if TYPE_CHECKING:
    from sqlbroker.storage.postgres.connection import PostgresPool


class CallerConnections:
    """Joins callers' connections for one pool, remembering each one's database."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool
        self._sql = pool.sql
        self._identity: tuple[Any, ...] | None = None
        """Our database's identity (``connection_identity``), read on the first ``conn=``."""
        self._identities: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = (
            weakref.WeakKeyDictionary()
        )
        """Each caller's connection's identity: a session cannot change database, so one
        read per connection object (the cost of a ``conn=`` stays a dictionary lookup)."""
        self._own: weakref.WeakSet[Any] = weakref.WeakSet()
        """The pool's own connections, handed back to us as ``conn=`` by ``msg.transaction()``
        (a saga step's bookkeeping): ours by construction, so never checked. Checking one
        would take a second connection while holding the first, and handlers holding the
        whole pool that way would wait for each other until the pool's timeout."""

    def own(self, conn: Conn | AsyncConn) -> None:
        """Remember ``conn`` as one of the pool's own connections."""
        self._own.add(conn)

    @contextmanager
    def joined(self, conn: CallerConnection) -> Iterator[Conn]:
        """The driver connection behind ``conn``, inside the caller's transaction."""
        try:
            raw = caller.unwrap(conn)
        except psycopg.Error as error:
            raise translate(error, self._pool.options, write=True, conn=None) from None
        if not isinstance(raw, psycopg.Connection):
            raise InvalidOption(
                "conn",
                "a PostgreSQL broker needs a psycopg 3 connection (or SQLAlchemy / Django"
                f" over psycopg 3), not {caller.describe(raw)}",
            )
        # Only a transaction of our own commits here (a connection lost before it began, or
        # inside the caller's transaction, which it takes along, applied nothing).
        ours = False
        try:
            self._check_same_database(raw)
            status = _status(raw)
            if raw.autocommit and status == TransactionStatus.IDLE:
                ours = True
                with raw.transaction():
                    yield raw
                return
            raw.execute(self._sql["savepoint"])
            try:
                yield raw
            except BaseException:
                if not raw.broken and raw.info.transaction_status != TransactionStatus.UNKNOWN:
                    raw.execute(self._sql["savepoint_rollback"])
                raise
            raw.execute(self._sql["savepoint_release"])
        except psycopg.Error as error:
            raise translate(error, self._pool.options, write=ours, conn=raw) from None

    @asynccontextmanager
    async def joined_async(self, conn: CallerConnection) -> AsyncIterator[AsyncConn]:
        """:meth:`joined` for an async caller's connection."""
        try:
            raw = await caller.unwrap_async(conn)
        except psycopg.Error as error:
            raise translate(error, self._pool.options, write=True, conn=None) from None
        if not isinstance(raw, psycopg.AsyncConnection):
            raise InvalidOption(
                "conn",
                "an async publish on PostgreSQL needs a psycopg.AsyncConnection (or"
                f" SQLAlchemy's asyncio over psycopg 3), not {caller.describe(raw)}",
            )
        ours = False
        try:
            await self._check_same_database_async(raw)
            status = _status(raw)
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
            raise translate(error, self._pool.options, write=ours, conn=raw) from None

    def _check_same_database(self, raw: Conn) -> None:
        if raw in self._own:
            return
        theirs = self._identities.get(raw)
        if theirs is None:
            if self._identity is None:
                # Ours first, while the caller's connection may still hold no server
                # session: read after theirs, two callers' transactions behind a transaction
                # pooler of two server sessions each waited for a third until the network
                # timeout.
                self._read_own_identity()
            _status(raw)  # a failed transaction would refuse the read
            row = raw.execute(self._sql["connection_identity"]).fetchone()
            theirs = self._identities[raw] = tuple(row or ())
        if theirs != self._identity:
            # Ours is read again before refusing: a restart or a failover changes it.
            self._read_own_identity()
            self._refuse_other_database(theirs)

    def _read_own_identity(self) -> None:
        with self._pool.connection(write=False) as own:
            self._identity = tuple(own.execute(self._sql["connection_identity"]).fetchone() or ())

    async def _check_same_database_async(self, raw: AsyncConn) -> None:
        if raw in self._own:
            return
        theirs = self._identities.get(raw)
        if theirs is None:
            if self._identity is None:
                await self._read_own_identity_async()  # ours first: see _check_same_database
            _status(raw)
            cursor = await raw.execute(self._sql["connection_identity"])
            theirs = self._identities[raw] = tuple(await cursor.fetchone() or ())
        if theirs != self._identity:
            await self._read_own_identity_async()
            self._refuse_other_database(theirs)

    async def _read_own_identity_async(self) -> None:
        # A connection of its own, not the loop's pool: a caller's loop (AsyncBroker's
        # publish) has none, and one opened here would outlive the loop.
        options = self._pool.options
        try:
            own = await psycopg.AsyncConnection.connect(
                options.url.raw, **options.connection_kwargs()
            )
        except psycopg.OperationalError as error:
            raise self._pool.not_connected(error, write=False) from None
        async with own:
            cursor = await own.execute(self._sql["connection_identity"])
            self._identity = tuple(await cursor.fetchone() or ())

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
        raise InvalidOption("conn", f"is connected to {where} ({self._pool.options.url})")


def _status(raw: Conn | AsyncConn) -> TransactionStatus:
    """The caller's connection's transaction status, refusing one we cannot join."""
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
