"""PostgreSQL backend: psycopg 3 with a psycopg_pool connection pool.

Connections run in autocommit mode: most operations are one statement, so no transaction
stays open between a claim and its ack, and none spans handler time. Claims use
``FOR UPDATE SKIP LOCKED`` on a partial index that matches the claim's ORDER BY exactly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.rows import dict_row

from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import ConnectionLost
from sqlbroker.core.limits import Limits
from sqlbroker.core.message import (
    Delivery,
    Subscription,
)
from sqlbroker.core.serde import encode_json
from sqlbroker.core.topics import pattern_regex
from sqlbroker.storage.base import (
    DeadRequest,
    Lease,
    ReapResult,
    RetryRequest,
    undecodable_deaths,
)
from sqlbroker.storage.columns import utc
from sqlbroker.storage.postgres.admin import PostgresAdmin
from sqlbroker.storage.postgres.connection import (
    AsyncConn,
    Conn,
    Plan,
    PostgresPool,
    Statement,
    run_plan,
    run_plan_async,
)
from sqlbroker.storage.postgres.liveness import Watchdog
from sqlbroker.storage.postgres.observability import PostgresObservability
from sqlbroker.storage.postgres.processed import PostgresProcessed
from sqlbroker.storage.postgres.publishing import PostgresPublishing
from sqlbroker.storage.postgres.sagas import PostgresSagas
from sqlbroker.storage.postgres.schedules import PostgresSchedules
from sqlbroker.storage.postgres.schema import PostgresSchema, qualifier
from sqlbroker.storage.postgres.security import PostgresSecurity
from sqlbroker.storage.promotion import PromotionThrottle
from sqlbroker.storage.rows import deliveries_of, error_json, subscriptions_of
from sqlbroker.storage.sql import load_sql
from sqlbroker.storage.url import DatabaseURL, redact

log = logging.getLogger("sqlbroker.storage")
_PROMOTE_BATCH = 1000
_WORKER_LOST = encode_json(
    {"type": "sqlbroker.WorkerLost", "message": "the lease expired without an ack"}
)
_SQL_FILES = ("queries.sql", "processed.sql", "sagas.sql")


class PostgresBackend(
    PostgresPublishing,
    PostgresAdmin,
    PostgresProcessed,
    PostgresObservability,
    PostgresSchedules,
    PostgresSagas,
    PostgresSecurity,
    PostgresSchema,
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
        limits: Limits | None = None,
    ) -> None:
        durable_claims = validate.flag(durable_claims, "durable_claims")
        archive = validate.flag(archive_completed, "archive_completed")
        self._url = url
        self._clock = clock
        self.limits = limits or Limits()
        self._known_queues = set()
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
        )
        self.notify_channel = "sqlbroker" if schema is None else f"sqlbroker_{schema}"
        self._promotion = PromotionThrottle()
        # A claim's own commit: see message_claim in queries.sql.
        self._claim_commit = self._db.synchronous_commit if durable_claims else "off"
        self.dead_channel = f"{self.notify_channel}_dead"
        self._complete_sql = self._sql[
            "message_complete" if archive else "message_complete_unarchived"
        ]

    def __repr__(self) -> str:
        return f"PostgresBackend({self._url!s})"

    def connection_kwargs(self) -> dict[str, Any]:
        """Settings for any other connection to open (the runtime's listener)."""
        return self._db.connection_kwargs()

    @property
    def conninfo(self) -> str:
        return self._db.conninfo

    def _now_param(self) -> datetime | None:
        return self._clock.now()

    def now(self) -> datetime:
        with self._db.connection(write=False) as conn:
            row = conn.execute(self._sql["now"], {"now": self._now_param()}).fetchone()
        assert row is not None
        return utc(row[0])

    def close(self) -> None:
        self._db.close()

    async def listen_async(self, *, on_hint: Callable[[str | None], None]) -> None:
        # On the caller's loop, not in a thread of its own: a notification reaches the
        # claim without a hop between threads.
        statement = sql.SQL("LISTEN {}").format(sql.Identifier(self.notify_channel))
        pause = 0.1
        health_every = self._db.network_timeout / 2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._db.conninfo, **self._db.connection_kwargs()
                ) as conn:
                    await conn.execute(statement)
                    pause = 0.1
                    # Notifications sent while we were not listening are gone: poll now.
                    on_hint(None)
                    while True:
                        async for notice in conn.notifies(timeout=health_every):
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

    # --- subscriptions -----------------------------------------------------------------------

    def subscription_upsert(
        self, *, name: str, patterns: Sequence[str], replace: bool, conn: Any = None
    ) -> Subscription:
        now = self._now_param()
        with self._db.transaction(conn) as c:
            c.execute(self._sql["subscription_insert"], {"name": name, "now": now})
            if replace:
                c.execute(self._sql["subscription_patterns_clear"], {"name": name})
            c.execute(
                self._sql["subscription_pattern_insert"],
                {
                    "name": name,
                    "patterns": list(patterns),
                    "regexes": [pattern_regex(p) for p in patterns],
                },
            )
            ((own, subscriptions, total),) = c.execute(
                self._sql["subscription_room"], {"name": name}
            ).fetchall()
            self.limits.check_room(
                subscription=name, own_patterns=own, subscriptions=subscriptions, patterns=total
            )
            rows = (
                c.cursor(row_factory=dict_row)
                .execute(self._sql["subscription_get"], {"name": name})
                .fetchall()
            )
        return subscriptions_of(rows)[0]

    def subscription_ensure(self, *, name: str) -> bool:
        with self._db.transaction() as conn:
            created = run_plan(conn, self._queue_create_plan(name, self._now_param()))
        self._remember_queue(name)
        return created

    def subscription_list(self) -> list[Subscription]:
        with self._db.connection(write=False) as conn:
            return subscriptions_of(
                conn.cursor(row_factory=dict_row).execute(self._sql["subscription_list"]).fetchall()
            )

    def subscription_delete(self, *, name: str) -> bool:
        self._known_queues.discard(name)
        with self._db.connection(write=True) as conn:
            return conn.execute(self._sql["subscription_delete"], {"name": name}).rowcount > 0

    # --- consuming ---------------------------------------------------------------------------

    def message_claim_many(
        self,
        *,
        subscription: str,
        limit: int,
        lease: float,
        worker: str | None,
        max_attempts: int | None = None,
    ) -> list[Delivery]:
        promote, claim = self._claim_statements(subscription, limit, lease, worker, max_attempts)
        with self._db.connection(write=True) as conn:
            if promote is not None:
                # Both statements travel in one round trip; the promotion commits first, so
                # the claim sees delayed messages that just became due.
                with conn.pipeline():
                    conn.execute(*promote)
                    cursor = conn.execute(*claim)
            else:
                cursor = conn.execute(*claim)
            rows = cursor.fetchall()
        deliveries, damaged = deliveries_of(rows)
        if damaged:
            self.message_dead_many(deaths=undecodable_deaths(damaged))
        return deliveries

    async def message_claim_many_async(
        self,
        *,
        subscription: str,
        limit: int,
        lease: float,
        worker: str | None,
        max_attempts: int | None = None,
    ) -> list[Delivery]:
        promote, claim = self._claim_statements(subscription, limit, lease, worker, max_attempts)
        async with self._db.connection_async(write=True) as conn:
            if promote is not None:
                async with conn.pipeline():
                    await conn.execute(*promote)
                    cursor = await conn.execute(*claim)
            else:
                cursor = await conn.execute(*claim)
            rows = await cursor.fetchall()
        deliveries, damaged = deliveries_of(rows)
        if damaged:
            # Rare: the sync pool, in a thread, rather than an async copy of the statement.
            await asyncio.to_thread(self.message_dead_many, deaths=undecodable_deaths(damaged))
        return deliveries

    def _claim_statements(
        self,
        subscription: str,
        limit: int,
        lease: float,
        worker: str | None,
        max_attempts: int | None,
    ) -> tuple[Statement | None, Statement]:
        """The claim, and before it the promotion of due delayed copies when one is due."""
        now = self._now_param()
        claim = {
            "subscription": subscription,
            "now": now,
            "lease": lease,
            "limit": limit,
            "worker": worker,
            "max_attempts": max_attempts,
            "claim_commit": self._claim_commit,
        }
        promote: Statement | None = None
        if self._promotion.due(subscription, None if now is None else now.timestamp()):
            promote = (
                self._sql["message_promote_scheduled"],
                {"subscription": subscription, "now": now, "limit": _PROMOTE_BATCH},
            )
        return promote, (self._sql["message_claim"], claim)

    @staticmethod
    def _lease_params(leases: Sequence[Lease]) -> dict[str, Any]:
        return {"ids": [lease.id for lease in leases], "tokens": [lease.token for lease in leases]}

    def message_complete_many(self, *, leases: Sequence[Lease], conn: Any = None) -> list[int]:
        if not leases:
            return []
        plan = self._complete_plan(leases, self._now_param())
        if conn is None:
            with self._db.connection(write=True) as c:
                return run_plan(c, plan)
        with self._db.transaction(conn) as c:
            return run_plan(c, plan)

    async def message_complete_many_async(self, *, leases: Sequence[Lease], conn: Any) -> list[int]:
        if not leases:
            return []
        async with self._db.transaction_async(conn) as c:
            return await run_plan_async(c, self._complete_plan(leases, self._now_param()))

    def transaction(self) -> AbstractContextManager[Conn]:
        # The caller's statements run in it (a handler's effects): never timed.
        return self._db.transaction(watched=False)

    def transaction_async(self) -> AbstractAsyncContextManager[AsyncConn]:
        return self._db.transaction_async(watched=False)

    async def close_async(self) -> None:
        await self._db.close_async()

    def _complete_plan(self, leases: Sequence[Lease], now: datetime | None) -> Plan[list[int]]:
        rows = yield self._complete_sql, {**self._lease_params(leases), "now": now}
        yield from self._promote_plan(rows, now)
        return [row[0] for row in rows]

    def _promote_after(self, conn: Conn, removed: Sequence[tuple[Any, ...]]) -> None:
        run_plan(conn, self._promote_plan(removed, self._now_param()))

    def _promote_plan(self, removed: Sequence[tuple[Any, ...]], now: datetime | None) -> Plan[None]:
        """Rows ``(id, subscription, ordering_key, state, …)`` just left the hot table: keys
        whose head was among them get their next copy. A crash before this statement leaves
        the key headless until the reaper's ``key_repair``."""
        heads = sorted(
            {(row[1], row[2]) for row in removed if row[2] is not None and row[3] != "blocked"}
        )
        if heads:
            yield (
                self._sql["key_promote"],
                {
                    "subscriptions": [subscription for subscription, _ in heads],
                    "keys": [key for _, key in heads],
                    "now": now,
                },
            )

    def message_retry_many(self, *, retries: Sequence[RetryRequest]) -> list[int]:
        if not retries:
            return []
        params = {
            **self._lease_params([r.lease for r in retries]),
            "afters": [float(r.after) for r in retries],
            "errors": [error_json(r.error) for r in retries],
            "snoozes": [r.snooze for r in retries],
            "now": self._now_param(),
            "channel": self.notify_channel,
        }
        with self._db.connection(write=True) as conn:
            return [row[0] for row in conn.execute(self._sql["message_retry"], params).fetchall()]

    def message_dead_many(self, *, deaths: Sequence[DeadRequest]) -> list[int]:
        if not deaths:
            return []
        params = {
            **self._lease_params([d.lease for d in deaths]),
            "reasons": [d.reason for d in deaths],
            "error_types": [d.error.type if d.error else None for d in deaths],
            "error_messages": [d.error.message if d.error else None for d in deaths],
            "tracebacks": [d.error.traceback if d.error else None for d in deaths],
            "now": self._now_param(),
            "dead_channel": self.dead_channel,
        }
        with self._db.connection(write=True) as conn:
            rows = conn.execute(self._sql["message_dead"], params).fetchall()
            self._promote_after(conn, rows)
        return [row[0] for row in rows]

    def message_extend_leases(
        self, *, leases: Sequence[Lease], lease: float
    ) -> dict[int, datetime]:
        if not leases:
            return {}
        with self._db.connection(write=True) as conn:
            rows = conn.execute(
                self._sql["message_extend"],
                {**self._lease_params(leases), "lease": lease, "now": self._now_param()},
            ).fetchall()
        return {row[0]: utc(row[1]) for row in rows}

    def message_release_many(self, *, leases: Sequence[Lease]) -> list[int]:
        if not leases:
            return []
        with self._db.connection(write=True) as conn:
            rows = conn.execute(self._sql["message_release"], self._lease_params(leases)).fetchall()
        return sorted(row[0] for row in rows)

    def message_cancel_many(self, *, message_ids: Sequence[str]) -> int:
        with self._db.connection(write=True) as conn:
            rows = conn.execute(
                self._sql["message_cancel"],
                {"message_ids": list(message_ids), "now": self._now_param()},
            ).fetchall()
            self._promote_after(conn, rows)
        return len(rows)

    # --- maintenance -------------------------------------------------------------------------

    def lease_release_expired(self, *, limit: int) -> ReapResult:
        params = {
            "now": self._now_param(),
            "limit": limit,
            "dead_channel": self.dead_channel,
            "last_error": _WORKER_LOST,
        }
        with self._db.connection(write=True) as conn:
            dead = conn.execute(self._sql["lease_expired_dead"], params).fetchall()
            self._promote_after(conn, dead)
            released = conn.execute(self._sql["lease_expired_release"], params).rowcount
        return ReapResult(released=released, dead=len(dead))

    def message_expire(self, *, limit: int) -> int:
        with self._db.connection(write=True) as conn:
            rows = conn.execute(
                self._sql["message_expire"], {"now": self._now_param(), "limit": limit}
            ).fetchall()
            self._promote_after(conn, rows)
        return len(rows)

    def key_repair(self, *, limit: int) -> int:
        with self._db.connection(write=True) as conn:
            return conn.execute(
                self._sql["key_repair"], {"now": self._now_param(), "limit": limit}
            ).rowcount

    def dedupe_trim(self, *, limit: int) -> int:
        with self._db.connection(write=True) as conn:
            return conn.execute(
                self._sql["dedupe_trim"], {"now": self._now_param(), "limit": limit}
            ).rowcount

    def archive_trim(self, *, older_than: datetime, limit: int) -> int:
        with self._db.connection(write=True) as conn:
            return conn.execute(
                self._sql["archive_trim"], {"older_than": older_than, "limit": limit}
            ).rowcount
