"""PostgreSQL backend: psycopg 3 with a psycopg_pool connection pool.

Connections run in autocommit mode: most operations are one statement, so no transaction
stays open between a claim and its ack, and none spans handler time. Claims use
``FOR UPDATE SKIP LOCKED`` on a partial index that matches the claim's ORDER BY exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql

from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import ConnectionLost, InvalidOption
from sqlbroker.core.limits import Limits
from sqlbroker.core.serde import encode_json
from sqlbroker.storage.columns import utc
from sqlbroker.storage.operations.subscriptions import KnownQueues
from sqlbroker.storage.plan import Access, Plan
from sqlbroker.storage.postgres import dialect
from sqlbroker.storage.postgres.connection import (
    Conn,
    PostgresPool,
)
from sqlbroker.storage.postgres.liveness import Watchdog
from sqlbroker.storage.postgres.results import PostgresResults
from sqlbroker.storage.postgres.schema import PostgresSchema, qualifier
from sqlbroker.storage.promotion import PromotionThrottle
from sqlbroker.storage.result_hub import ResultHub
from sqlbroker.storage.schedules import ScheduleFire, fire_many
from sqlbroker.storage.seam import AsyncExecutor, AsyncTx, Executor, Settings, Tx
from sqlbroker.storage.sql import load_sql
from sqlbroker.storage.url import DatabaseURL, parse_url, redact

log = logging.getLogger("sqlbroker.storage")
_PROMOTE_BATCH = 1000
_WORKER_LOST = encode_json(
    {"type": "sqlbroker.WorkerLost", "message": "the lease expired without an ack"}
)
_SQL_FILES = (
    "queries.sql",
    "admin.sql",
    "processed.sql",
    "sagas.sql",
    "schedules.sql",
    "observability.sql",
    "security.sql",
    "results.sql",
    "retention.sql",
    "control.sql",
)
T = TypeVar("T")


class PostgresBackend(
    PostgresResults,
    PostgresSchema,
    Executor,
):
    name = "postgresql"
    supports_notify = True

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
        self._url = url
        self._clock = clock
        self.limits = limits or Limits()
        self._schema = schema
        self._qualifier = qualifier(schema)
        self._sql = load_sql("sqlbroker.storage.postgres", _SQL_FILES, schema=self._qualifier)
        self._db = PostgresPool(
            url,
            pool_size=pool_size,
            synchronous_commit=synchronous_commit,
            connect_timeout=connect_timeout,
            application_name=application_name,
            sql=self._sql,
            network_timeout=network_timeout,
            lock_timeout=lock_timeout,
            statement_timeout=statement_timeout,
            pooler=pooler,
            listen_url=None if listen_url is None else _listen_url(listen_url),
        )
        self.notify_channel = "sqlbroker" if schema is None else f"sqlbroker_{schema}"
        self._promotion = PromotionThrottle()
        # A claim's own commit: see message_claim in queries.sql.
        self._claim_commit = self._db.synchronous_commit if durable_claims else "off"
        self.dead_channel = f"{self.notify_channel}_dead"
        self.result_channel = f"{self.notify_channel}_result"
        self.cancel_channel = f"{self.notify_channel}_cancel"
        self._result_hub = ResultHub(self._result_source, name="sqlbroker-result")
        self._archive_completed = archive
        self.settings = Settings(
            dialect="postgresql",
            limits=self.limits,
            clock=clock,
            promotion=self._promotion,
            dead_channel=self.dead_channel,
            cancel_channel=self.cancel_channel,
            claim_commit=self._claim_commit,
            supports_notify=True,
            notify_channel=self.notify_channel,
            key_locks=True,
            partitioned_archive=True,
            schema=self._schema,
            archive_completed=self._archive_completed,
            result_channel=self.result_channel,
            array_params=True,
            known_queues=KnownQueues(),
        )
        self.async_ops: AsyncExecutor = _PostgresAsyncOps(self)

    def __repr__(self) -> str:
        return f"PostgresBackend({self._url!s})"

    def connection_kwargs(self) -> dict[str, Any]:
        """Settings of the pools' connections (a LISTEN session's: ``listen_target``)."""
        return self._db.connection_kwargs()

    @property
    def conninfo(self) -> str:
        return self._db.conninfo

    def _now_param(self) -> datetime | None:
        return self._clock.now()

    # --- the seam ----------------------------------------------------------------------------

    def execute(self, plan: Plan[T], access: Access) -> T:
        """Run one operation on a pooled connection: an ``atomic`` one in a transaction,
        any other in autocommit, each of its statements committing on its own."""
        if access.atomic:
            with self._db.transaction() as conn:
                return dialect.run(conn, self._sql, plan, self._clock.now())
        with self._db.connection(write=not access.read_only) as conn:
            return dialect.run(conn, self._sql, plan, self._clock.now())

    @contextlib.contextmanager
    def begin(self, conn: Any = None, *, timed: bool = True) -> Iterator[Tx]:
        """One transaction for several operations: ours (committed when the block ends
        normally, rolled back otherwise), or with ``conn`` the caller's connection (psycopg,
        SQLAlchemy or Django over psycopg) joined as a savepoint and never committed here."""
        with self._db.transaction(conn, watched=timed) as raw:
            yield Tx(self.settings, functools.partial(self._run_on, raw), raw)

    def _run_on(self, conn: Conn, plan: Plan[T]) -> T:
        return dialect.run(conn, self._sql, plan, self._clock.now())

    @contextlib.asynccontextmanager
    async def begin_async(self, conn: Any = None, *, timed: bool = True) -> AsyncIterator[AsyncTx]:
        """:meth:`begin` for coroutines, on a connection of the running loop's pool or the
        caller's async connection (psycopg's ``AsyncConnection``, SQLAlchemy's asyncio)."""
        async with self._db.transaction_async(conn, watched=timed) as raw:

            async def run(plan: Plan[Any]) -> Any:
                return await dialect.run_async(raw, self._sql, plan, self._clock.now())

            yield AsyncTx(self.settings, run, raw)

    def now(self) -> datetime:
        with self._db.connection(write=False) as conn:
            row = conn.execute(self._sql["now"], {"now": self._now_param()}).fetchone()
        assert row is not None
        return utc(row[0])

    def close(self) -> None:
        self._result_hub.close()
        self._db.close()

    async def listen_async(
        self,
        *,
        on_hint: Callable[[str | None], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        # On the caller's loop, not in a thread of its own: a notification reaches the
        # claim without a hop between threads.
        channels = [self.notify_channel] + ([self.cancel_channel] if on_cancel else [])
        statements = [sql.SQL("LISTEN {}").format(sql.Identifier(name)) for name in channels]
        pause = 0.1
        health_every = self._db.network_timeout / 2
        target = self._db.listen_target()
        if target is None:
            # Behind a transaction pooler without listen_url: the poll alone, for good.
            log.info("no LISTEN behind a transaction pooler (no listen_url): polling only")
            on_hint(None)
            await asyncio.Event().wait()
            return
        conninfo, kwargs = target
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, **kwargs) as conn:
                    for statement in statements:
                        await conn.execute(statement)
                    pause = 0.1
                    # Notifications sent while we were not listening are gone: poll now.
                    on_hint(None)
                    while True:
                        async for notice in conn.notifies(timeout=health_every):
                            if on_cancel is not None and notice.channel == self.cancel_channel:
                                on_cancel(notice.payload)
                            else:
                                on_hint(notice.payload or None)
                        # A session that went silent (a peer gone, its TCP session kept
                        # alive by a proxy) would wait for notifications for ever: ask.
                        watchdog = Watchdog(conn, health_every)
                        try:
                            await conn.execute(self._sql["health_check"])
                        except psycopg.Error as error:
                            if watchdog.fired:
                                raise watchdog.lost(write=False) from error
                            raise
                        finally:
                            watchdog.cancel()
            except (psycopg.Error, ConnectionLost) as error:
                log.warning(
                    "LISTEN connection lost (%s); reconnecting in %.1f s",
                    redact(str(error)).strip(),
                    pause,
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    # --- consuming ---------------------------------------------------------------------------

    def schedule_fire_many(self, *, fires: Sequence[ScheduleFire]) -> dict[str, list[str]]:
        return fire_many(self, fires=fires)

    async def close_async(self) -> None:
        await self._db.close_async()

    # --- maintenance -------------------------------------------------------------------------


def _listen_url(url: str) -> DatabaseURL:
    parsed = parse_url(url)
    if parsed.scheme != "postgresql":
        raise InvalidOption("listen_url", f"must be a postgresql:// URL, not {parsed}")
    return parsed


class _PostgresAsyncOps(AsyncExecutor):
    """The operations for coroutines, on the running loop's async pool."""

    def __init__(self, backend: PostgresBackend) -> None:
        self.settings = backend.settings
        self._backend = backend

    async def execute(self, plan: Plan[T], access: Access) -> T:
        backend = self._backend
        if access.atomic:
            async with backend._db.transaction_async() as conn:
                return await dialect.run_async(conn, backend._sql, plan, backend._clock.now())
        async with backend._db.connection_async(write=not access.read_only) as conn:
            return await dialect.run_async(conn, backend._sql, plan, backend._clock.now())
