"""SQLite publishing: idempotency keys, routing and the insert of every copy, in the
caller's or one ``BEGIN IMMEDIATE`` transaction."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from sqlbroker.core.errors import IdempotencyConflict, InvalidOption
from sqlbroker.core.limits import check_copies
from sqlbroker.core.message import NewMessage, State
from sqlbroker.core.topics import route_params
from sqlbroker.storage import caller
from sqlbroker.storage.base import InsertResult
from sqlbroker.storage.sqlite.connection import SqlitePool
from sqlbroker.storage.sqlite.threads import SqliteThreads


class SqlitePublishing:
    """The publish of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool
    _sql: dict[str, str]

    _threads: SqliteThreads

    _now: Callable[[], float]

    _ensure_queue: Callable[[sqlite3.Connection, str, float], bool]

    def message_insert_many(
        self,
        *,
        messages: Sequence[NewMessage],
        subscription: str | None,
        conn: Any = None,
        max_copies: int | None = None,
    ) -> InsertResult:
        now = self._now()
        ids: list[str] = []
        rows: list[dict[str, Any]] = []
        unrouted: list[dict[str, Any]] = []
        duplicates = 0
        with self._db.write(conn) as c:
            routes: dict[str, list[str]] = {}
            for message in messages:
                if message.idempotency_key is not None:
                    original = self._dedupe_reserve(c, message, now)
                    if original is not None:
                        ids.append(original)
                        duplicates += 1
                        continue
                ids.append(message.message_id)
                available_at = (
                    message.available_at.timestamp()
                    if message.available_at
                    else now + (message.delay or 0.0)
                )
                if message.expires_at is not None:
                    expires_at: float | None = message.expires_at.timestamp()
                else:
                    expires_at = None if message.ttl is None else now + message.ttl
                values = {
                    "message_id": message.message_id,
                    "topic": message.topic,
                    "state": State.SCHEDULED.value if available_at > now else State.AVAILABLE.value,
                    "priority": message.priority,
                    "ordering_key": message.ordering_key,
                    "idempotency_key": message.idempotency_key,
                    "payload": message.payload,
                    "content_type": message.content_type,
                    "headers": message.headers,
                    "max_attempts": message.max_attempts,
                    "now": now,
                    "available_at": available_at,
                    "expires_at": expires_at,
                }
                if subscription is not None:
                    targets = [subscription]
                else:
                    if message.topic not in routes:
                        routes[message.topic] = [
                            row[0]
                            for row in c.execute(
                                self._sql["message_routes"], route_params(message.topic)
                            )
                        ]
                    targets = routes[message.topic]
                if not targets:
                    unrouted.append(values)
                # Counted before the copies are built: a huge fan-out stops here.
                check_copies(len(rows) + len(targets), len(messages), max_copies)
                rows.extend({**values, "subscription": target} for target in targets)
            # A queue is created by its first message, not by a duplicate that writes nothing.
            if subscription is not None and rows:
                self._ensure_queue(c, subscription, now)
            c.executemany(self._sql["message_insert"], rows)
            c.executemany(self._sql["archive_insert_unrouted"], unrouted)
        return InsertResult(message_ids=ids, duplicates=duplicates, unrouted=len(unrouted))

    async def message_insert_many_async(
        self,
        *,
        messages: Sequence[NewMessage],
        subscription: str | None,
        conn: Any = None,
        max_copies: int | None = None,
    ) -> InsertResult:
        if conn is None:
            insert = functools.partial(
                self.message_insert_many,
                messages=messages,
                subscription=subscription,
                max_copies=max_copies,
            )
            return await self._threads.run(insert)
        raise InvalidOption(
            "conn",
            "SQLite has no async connections: pass the sqlite3.Connection itself"
            f" (not {caller.describe(conn)})",
        )

    def _dedupe_reserve(self, c: sqlite3.Connection, message: NewMessage, now: float) -> str | None:
        """Reserve the message's idempotency key; return the original id for a duplicate."""
        params = {
            "topic": message.topic,
            "idempotency_key": message.idempotency_key,
            "message_id": message.message_id,
            "payload_hash": message.payload_hash,
            "now": now,
            "window": message.dedupe_window,
        }
        if c.execute(self._sql["dedupe_reserve"], params).rowcount == 1:
            return None
        # Index access: with conn= the caller's connection may use any row factory.
        original, digest = c.execute(self._sql["dedupe_get"], params).fetchone()
        if digest != message.payload_hash:
            assert message.idempotency_key is not None
            raise IdempotencyConflict(message.topic, message.idempotency_key, original)
        return str(original)
