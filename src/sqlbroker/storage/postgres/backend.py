"""PostgreSQL backend: psycopg 3 with a psycopg_pool connection pool.

Connections run in autocommit mode: most operations are one statement, so no transaction
stays open between a claim and its ack, and none spans handler time. Claims use
``FOR UPDATE SKIP LOCKED`` on a partial index that matches the claim's ORDER BY exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql

from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import InvalidOption, SchemaError
from sqlbroker.core.limits import Limits
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.plan import Access, Plan
from sqlbroker.storage.postgres import dialect, listening
from sqlbroker.storage.postgres.connection import PostgresPool
from sqlbroker.storage.postgres.errors import Conn
from sqlbroker.storage.postgres.options import SessionOptions
from sqlbroker.storage.result_hub import ResultHub
from sqlbroker.storage.seam import AsyncTx, Settings
from sqlbroker.storage.sql import load_sql
from sqlbroker.storage.threads import OwnThreads
from sqlbroker.storage.url import DatabaseURL, parse_url, redact

T = TypeVar("T")


class PostgresBackend(Backend):
    name = "postgresql"
    supports_notify = True
    schema_files = dialect.SCHEMA
    _db: PostgresPool

    def __init__(
        self,
        url: DatabaseURL,
        *,
        clock: Clock,
        schema: str | None = None,
        pool_size: int = 10,
        synchronous_commit: str = "on",
        durable_claims: bool = False,
        archive_completed: bool = True,
        connect_timeout: float = 10.0,
        application_name: str = "sqlbroker",
        network_timeout: float = 30.0,
        lock_timeout: float | None = None,
        statement_timeout: float | None = None,
        pooler: str | None = None,
        listen_url: str | None = None,
        limits: Limits | None = None,
    ) -> None:
        durable_claims = validate.flag(durable_claims, "durable_claims")
        archive = validate.flag(archive_completed, "archive_completed")
        super().__init__(url, clock=clock, limits=limits)
        self._schema = schema
        self._qualifier = dialect.qualifier(schema)
        self._sql = load_sql("sqlbroker.storage.postgres", schema=self._qualifier)
        self._statements = dialect.encoded(self._sql)
        self._options = SessionOptions(
            url,
            pool_size=pool_size,
            synchronous_commit=synchronous_commit,
            connect_timeout=connect_timeout,
            application_name=application_name,
            network_timeout=network_timeout,
            lock_timeout=lock_timeout,
            statement_timeout=statement_timeout,
            pooler=pooler,
            listen_url=None if listen_url is None else _listen_url(listen_url),
        )
        self._db = PostgresPool(self._options, sql=self._sql)
        self._threads = OwnThreads(name="sqlbroker-pg", size=2)
        self.notify_channel = dialect.channel_name(schema)
        self.dead_channel = dialect.channel_name(schema, "_dead")
        self.result_channel = dialect.channel_name(schema, "_result")
        self.cancel_channel = dialect.channel_name(schema, "_cancel")
        self.result_hub = ResultHub(
            listening.result_source(
                self._options,
                self._sql,
                result_channel=self.result_channel,
                dead_channel=self.dead_channel,
            )
        )
        self._use(
            Settings(
                dialect="postgresql",
                limits=self.limits,
                clock=clock,
                dead_channel=self.dead_channel,
                cancel_channel=self.cancel_channel,
                # A claim's own commit: see message_claim in queries.sql.
                claim_commit=self._options.synchronous_commit if durable_claims else "off",
                supports_notify=True,
                notify_channel=self.notify_channel,
                key_locks=True,
                partitioned_archive=True,
                schema=schema,
                archive_completed=archive,
                result_channel=self.result_channel,
                array_params=True,
                inserts_create_queue=True,
                writes_in_with=True,
                roles=True,
            )
        )

    def connection_kwargs(self) -> dict[str, Any]:
        """Settings of the pools' connections (a LISTEN session's: ``listen_target``)."""
        return self._options.connection_kwargs()

    @property
    def conninfo(self) -> str:
        return self._url.raw

    # --- the seam ----------------------------------------------------------------------------

    def execute(self, plan: Plan[T], access: Access) -> T:
        """Run one operation on a pooled connection: an ``atomic`` one in a transaction,
        any other in autocommit, each of its statements committing on its own."""
        if access.atomic:
            with self._db.transaction() as conn:
                return dialect.run(conn, self._statements, plan, self._clock.now())
        with self._db.connection(write=not access.read_only) as conn:
            return dialect.run(conn, self._statements, plan, self._clock.now(), pooled=True)

    async def _execute_async(self, plan: Plan[T], access: Access) -> T:
        """:meth:`execute` on the running loop's async pool."""
        if access.atomic:
            async with self._db.transaction_async() as conn:
                return await dialect.run_async(conn, self._statements, plan, self._clock.now())
        async with self._db.connection_async(write=not access.read_only) as conn:
            return await dialect.run_async(
                conn, self._statements, plan, self._clock.now(), pooled=True
            )

    def _transaction(
        self, conn: CallerConnection | None, *, timed: bool
    ) -> AbstractContextManager[Conn]:
        """Ours on a pooled connection, or the caller's connection (psycopg, SQLAlchemy or
        Django over psycopg) joined as a savepoint."""
        return self._db.transaction(conn, watched=timed)

    def _run_on(self, conn: Conn, plan: Plan[T]) -> T:
        return dialect.run(conn, self._statements, plan, self._clock.now())

    @contextlib.asynccontextmanager
    async def begin_async(
        self, conn: CallerConnection | None = None, *, timed: bool = True
    ) -> AsyncIterator[AsyncTx]:
        """:meth:`begin` for coroutines, on a connection of the running loop's pool or the
        caller's async connection (psycopg's ``AsyncConnection``, SQLAlchemy's asyncio)."""
        async with self._db.transaction_async(conn, watched=timed) as raw:

            async def run(plan: Plan[Any]) -> Any:
                return await dialect.run_async(raw, self._statements, plan, self._clock.now())

            yield AsyncTx(self._tx_settings, run, raw)

    def now(self) -> datetime:
        """The database's clock (or the test clock): the seam's ``clock_now``."""
        return self.clock_now()

    def _close_blocks(self) -> bool:
        # The loops' pools close without waiting (libpq's PQfinish); the blocking pool
        # joins its threads, so it is closed on a thread of ours — when it was opened.
        return self._db.blocking_pool_open

    async def listen_async(
        self,
        *,
        on_hint: Callable[[str | None], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        await listening.listen(
            self._options,
            self._sql,
            channel=self.notify_channel,
            cancel_channel=self.cancel_channel,
            on_hint=on_hint,
            on_cancel=on_cancel,
        )

    # --- schema ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _migrating(self) -> Iterator[Conn]:
        # Untimed and unwatched: DDL may wait and run long.
        with self._db.transaction(watched=False) as conn:
            try:
                # Serialize concurrent migrators: the second waits, then finds nothing.
                conn.execute(self._sql["migrate_lock"])
                if self._schema is not None and not self._schema_exists(conn):
                    conn.execute(
                        sql.SQL(self._sql["schema_create"]).format(
                            name=sql.Identifier(self._schema)
                        )
                    )
                yield conn
            except psycopg.errors.InsufficientPrivilege as error:
                target = len(self.schema_files.migrations())
                raise SchemaError(
                    f"the schema needs migrating (to version {target}) but this role may not"
                    f" change it ({redact(str(error)).strip().splitlines()[0]}): run"
                    " `sqlbroker migrate` as the migrator role (see docs/security.md)"
                ) from None

    def _run_script(self, conn: Conn, script: str) -> None:
        conn.execute(script.encode())

    def _schema_exists(self, conn: Conn) -> bool:
        row = conn.execute(self._sql["schema_exists"], {"schema": self._schema}).fetchone()
        return bool(row and row[0])

    schema_sql = staticmethod(dialect.schema_sql)

    # --- consuming ---------------------------------------------------------------------------

    async def close_async(self) -> None:
        await self._db.close_async()


def _listen_url(url: str) -> DatabaseURL:
    parsed = parse_url(url)
    if parsed.scheme != "postgresql":
        raise InvalidOption("listen_url", f"must be a postgresql:// URL, not {parsed}")
    return parsed
