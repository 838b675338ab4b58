"""SQLite backend: stdlib ``sqlite3``, WAL, every write in ``BEGIN IMMEDIATE``.

Several processes on one host can share a database file: SQLite serializes writers and
``busy_timeout`` makes them wait instead of failing. Network filesystems are refused because
their locking cannot be trusted. Connections are pooled and handed to one thread at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from datetime import datetime
from typing import Any

from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import (
    StorageError,
)
from sqlbroker.core.limits import Limits
from sqlbroker.core.message import (
    Delivery,
    Outcome,
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
from sqlbroker.storage.promotion import PromotionThrottle
from sqlbroker.storage.rows import deliveries_of, error_json, subscriptions_of
from sqlbroker.storage.sql import load_sql
from sqlbroker.storage.sqlite.admin import SqliteAdmin
from sqlbroker.storage.sqlite.connection import SqlitePool
from sqlbroker.storage.sqlite.observability import SqliteObservability
from sqlbroker.storage.sqlite.processed import SqliteProcessed
from sqlbroker.storage.sqlite.publishing import SqlitePublishing
from sqlbroker.storage.sqlite.sagas import SqliteSagas
from sqlbroker.storage.sqlite.schedules import SqliteSchedules
from sqlbroker.storage.sqlite.schema import SqliteSchema
from sqlbroker.storage.sqlite.security import SqliteSecurity
from sqlbroker.storage.sqlite.threads import HeldTransaction, SqliteThreads
from sqlbroker.storage.url import DatabaseURL

log = logging.getLogger("sqlbroker.storage")
_WORKER_LOST = encode_json(
    {"type": "sqlbroker.WorkerLost", "message": "the lease expired without an ack"}
)
_PROMOTE_BATCH = 1000
_WATCH_MIN = 0.002
_WATCH_MAX = 0.05


class SqliteBackend(
    SqlitePublishing,
    SqliteAdmin,
    SqliteProcessed,
    SqliteObservability,
    SqliteSchedules,
    SqliteSagas,
    SqliteSecurity,
    SqliteSchema,
):
    name = "sqlite"
    supports_notify = False
    notify_channel = ""

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
        self._clock = clock
        self._url = url
        self.limits = limits or Limits()
        self._promotion = PromotionThrottle()
        self._db = SqlitePool(
            url.path, synchronous=synchronous, busy_timeout=busy_timeout, pool_size=pool_size
        )
        self._sql = load_sql(
            "sqlbroker.storage.sqlite", ("queries.sql", "processed.sql", "sagas.sql")
        )
        self._loop_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._threads = SqliteThreads()
        self._held: dict[int, HeldTransaction] = {}
        """The transactions of :meth:`transaction_async` by ``id()`` of their connection."""

    def __repr__(self) -> str:
        return f"SqliteBackend({self._url!s})"

    def _now(self) -> float:
        now = self._clock.now()
        return time.time() if now is None else now.timestamp()

    def now(self) -> datetime:
        return utc(self._now())

    def close(self) -> None:
        self._threads.shutdown()
        self._db.close()

    async def listen_async(self, *, on_hint: Callable[[str | None], None]) -> None:
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
                        version = conn.execute("PRAGMA data_version").fetchone()[0]
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

    # --- subscriptions -----------------------------------------------------------------------

    def subscription_upsert(
        self, *, name: str, patterns: Sequence[str], replace: bool, conn: Any = None
    ) -> Subscription:
        with self._db.write(conn) as c:
            c.execute(self._sql["subscription_insert"], {"name": name, "now": self._now()})
            if replace:
                c.execute(self._sql["subscription_patterns_clear"], {"name": name})
            c.executemany(
                self._sql["subscription_pattern_insert"],
                [{"name": name, "pattern": p, "regex": pattern_regex(p)} for p in patterns],
            )
            self._check_room(c, name)
            rows = c.execute(self._sql["subscription_get"], {"name": name}).fetchall()
        return subscriptions_of(rows)[0]

    def subscription_ensure(self, *, name: str) -> bool:
        with self._db.write() as c:
            return self._ensure_queue(c, name, self._now())

    def _ensure_queue(self, c: sqlite3.Connection, name: str, now: float) -> bool:
        params = {"name": name, "now": now}
        created = c.execute(self._sql["subscription_insert"], params).rowcount == 1
        if created:
            c.execute(
                self._sql["subscription_pattern_insert"],
                {"name": name, "pattern": name, "regex": pattern_regex(name)},
            )
            self._check_room(c, name)
        return created

    def _check_room(self, c: sqlite3.Connection, name: str) -> None:
        """The limits on subscriptions and patterns, after ``name`` was written (raising
        rolls that back)."""
        own, subscriptions, patterns = c.execute(
            self._sql["subscription_room"], {"name": name}
        ).fetchone()
        self.limits.check_room(
            subscription=name, own_patterns=own, subscriptions=subscriptions, patterns=patterns
        )

    def subscription_list(self) -> list[Subscription]:
        with self._db.read() as conn:
            return subscriptions_of(conn.execute(self._sql["subscription_list"]).fetchall())

    def subscription_delete(self, *, name: str) -> bool:
        with self._db.write() as conn:
            conn.execute(self._sql["subscription_delete_messages"], {"name": name})
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
        injected = self._clock.now()
        now = time.time() if injected is None else injected.timestamp()
        promote = self._promotion.due(subscription, None if injected is None else now)
        with self._db.write(flush=self._flush_claims) as conn:
            if promote:
                conn.execute(
                    self._sql["message_promote_scheduled"],
                    {"subscription": subscription, "now": now, "limit": _PROMOTE_BATCH},
                )
            rows = conn.execute(
                self._sql["message_claim"],
                {
                    "subscription": subscription,
                    "now": now,
                    "lease": lease,
                    "limit": limit,
                    "worker": worker,
                    "max_attempts": max_attempts,
                },
            ).fetchall()
        deliveries, damaged = deliveries_of(rows)
        if damaged:
            self.message_dead_many(deaths=undecodable_deaths(damaged))
        return deliveries

    def _valid_ids(self, conn: sqlite3.Connection, leases: Sequence[Lease]) -> list[int]:
        batch = json.dumps([[lease.id, lease.token] for lease in leases])
        return [row[0] for row in conn.execute(self._sql["lease_valid_ids"], {"batch": batch})]

    def _archive_and_delete(
        self, conn: sqlite3.Connection, ids: Sequence[int], outcome: Outcome, now: float
    ) -> None:
        if ids:
            conn.execute(
                self._sql["archive_insert_ids"],
                {"ids": json.dumps(list(ids)), "outcome": outcome.value, "now": now},
            )
            self._delete(conn, ids, now)

    def _delete(self, conn: sqlite3.Connection, ids: Sequence[int], now: float) -> None:
        """Delete copies from the hot table; keys whose head left get their next copy."""
        encoded = json.dumps(list(ids))
        heads = conn.execute(self._sql["key_heads_of_ids"], {"ids": encoded}).fetchall()
        conn.execute(self._sql["message_delete_ids"], {"ids": encoded})
        if heads:
            keys = json.dumps([[row[0], row[1]] for row in heads])
            conn.execute(self._sql["key_promote"], {"keys": keys, "now": now})

    async def message_claim_many_async(
        self,
        *,
        subscription: str,
        limit: int,
        lease: float,
        worker: str | None,
        max_attempts: int | None = None,
    ) -> list[Delivery]:
        return await self._threads.run(
            functools.partial(
                self.message_claim_many,
                subscription=subscription,
                limit=limit,
                lease=lease,
                worker=worker,
                max_attempts=max_attempts,
            )
        )

    def message_complete_many(self, *, leases: Sequence[Lease], conn: Any = None) -> list[int]:
        if not leases:
            return []
        now = self._now()
        with self._db.write(conn) as c:
            ids = self._valid_ids(c, leases)
            if self._archive_completed:
                self._archive_and_delete(c, ids, Outcome.COMPLETED, now)
            elif ids:
                self._delete(c, ids, now)
        return ids

    async def message_complete_many_async(self, *, leases: Sequence[Lease], conn: Any) -> list[int]:
        complete = functools.partial(self.message_complete_many, leases=leases, conn=conn)
        held = self._held.get(id(conn))
        if held is None:
            # A caller's own connection: used on the calling thread, where its owner uses
            # it (sqlite3 connections may refuse other threads).
            return complete()
        return await held.call(complete)

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._db.write()

    async def close_async(self) -> None:
        self._loop_locks.pop(asyncio.get_running_loop(), None)
        self._threads.shutdown()

    @asynccontextmanager
    async def transaction_async(self) -> AsyncIterator[sqlite3.Connection]:
        # The transaction lives on a thread of our own (HeldTransaction), one per
        # coroutine: two coroutines of one loop queue on an asyncio lock rather than hold
        # two threads, the second waiting on the write lock for the first.
        lock = self._loop_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:
            held = HeldTransaction(self._threads, self._db.write)
            conn = await held.enter()
            self._held[id(conn)] = held
            try:
                try:
                    yield conn
                except BaseException:
                    await held.leave(commit=False)
                    raise
                await held.leave(commit=True)
            finally:
                del self._held[id(conn)]

    def message_retry_many(self, *, retries: Sequence[RetryRequest]) -> list[int]:
        if not retries:
            return []
        batch = json.dumps(
            [
                [r.lease.id, r.lease.token, r.after, error_json(r.error), int(r.snooze)]
                for r in retries
            ]
        )
        with self._db.write() as conn:
            rows = conn.execute(
                self._sql["message_retry"], {"batch": batch, "now": self._now()}
            ).fetchall()
        return sorted(row[0] for row in rows)

    def message_dead_many(self, *, deaths: Sequence[DeadRequest]) -> list[int]:
        if not deaths:
            return []
        batch = json.dumps(
            [
                [
                    d.lease.id,
                    d.lease.token,
                    d.reason,
                    d.error.type if d.error else None,
                    d.error.message if d.error else None,
                    d.error.traceback if d.error else None,
                ]
                for d in deaths
            ]
        )
        with self._db.write() as conn:
            ids = self._valid_ids(conn, [d.lease for d in deaths])
            if ids:
                conn.execute(self._sql["dead_insert_leased"], {"batch": batch, "now": self._now()})
                self._delete(conn, ids, self._now())
        return ids

    def message_extend_leases(
        self, *, leases: Sequence[Lease], lease: float
    ) -> dict[int, datetime]:
        if not leases:
            return {}
        with self._db.write() as conn:
            ids = self._valid_ids(conn, leases)
            rows = conn.execute(
                self._sql["message_extend"],
                {"ids": json.dumps(ids), "now": self._now(), "lease": lease},
            ).fetchall()
        return {row[0]: utc(row[1]) for row in rows}

    def message_release_many(self, *, leases: Sequence[Lease]) -> list[int]:
        if not leases:
            return []
        with self._db.write() as conn:
            ids = self._valid_ids(conn, leases)
            rows = conn.execute(self._sql["message_release"], {"ids": json.dumps(ids)}).fetchall()
        return sorted(row[0] for row in rows)

    def message_cancel_many(self, *, message_ids: Sequence[str]) -> int:
        with self._db.write() as conn:
            ids = [
                row[0]
                for row in conn.execute(
                    self._sql["message_cancel_ids"], {"message_ids": json.dumps(list(message_ids))}
                )
            ]
            self._archive_and_delete(conn, ids, Outcome.CANCELLED, self._now())
        return len(ids)

    # --- maintenance -------------------------------------------------------------------------

    def lease_release_expired(self, *, limit: int) -> ReapResult:
        now = self._now()
        with self._db.write() as conn:
            spent = [
                row[0]
                for row in conn.execute(
                    self._sql["lease_expired_spent_ids"], {"now": now, "limit": limit}
                )
            ]
            if spent:
                conn.execute(
                    self._sql["dead_insert_ids"],
                    {
                        "ids": json.dumps(spent),
                        "now": now,
                        "reason": "worker lost: the lease expired on the last attempt",
                        "error_type": "sqlbroker.WorkerLost",
                        "error_message": "the worker holding the message stopped acknowledging it",
                    },
                )
                self._delete(conn, spent, now)
            released = conn.execute(
                self._sql["lease_expired_release"],
                {"now": now, "limit": limit, "last_error": _WORKER_LOST},
            ).rowcount
        return ReapResult(released=released, dead=len(spent))

    def message_expire(self, *, limit: int) -> int:
        now = self._now()
        with self._db.write() as conn:
            ids = [
                row[0]
                for row in conn.execute(
                    self._sql["message_expired_ids"], {"now": now, "limit": limit}
                )
            ]
            self._archive_and_delete(conn, ids, Outcome.EXPIRED, now)
        return len(ids)

    def key_repair(self, *, limit: int) -> int:
        with self._db.write() as conn:
            return conn.execute(
                self._sql["key_repair"], {"now": self._now(), "limit": limit}
            ).rowcount

    def dedupe_trim(self, *, limit: int) -> int:
        with self._db.write() as conn:
            return conn.execute(
                self._sql["dedupe_trim"], {"now": self._now(), "limit": limit}
            ).rowcount

    def archive_trim(self, *, older_than: datetime, limit: int) -> int:
        with self._db.write() as conn:
            return conn.execute(
                self._sql["archive_trim"], {"older_than": older_than.timestamp(), "limit": limit}
            ).rowcount
