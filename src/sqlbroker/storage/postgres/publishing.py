"""PostgreSQL publishing: the statements of a publish (idempotency keys, ordering keys,
routing) as one plan, run on a sync or an async connection inside one transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlbroker.core.errors import IdempotencyConflict
from sqlbroker.core.limits import Limits, check_copies
from sqlbroker.core.message import NewMessage
from sqlbroker.core.topics import pattern_regex
from sqlbroker.storage.base import InsertResult
from sqlbroker.storage.postgres.connection import (
    PostgresPool,
    StatementPlan,
    run_plan,
    run_plan_async,
)


def _float_or_none(value: float | None) -> float | None:
    # Array parameters travel in binary (``%(name)b`` in queries.sql: no quoting and
    # escaping of every element), and a binary array must not mix int and float.
    return None if value is None else float(value)


_KNOWN_QUEUES = 10_000
_UNLIMITED = 2**62


class PostgresPublishing:
    """The publish of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _sql: dict[str, str]
    notify_channel: str
    limits: Limits
    _known_queues: set[str]
    """Queues this process saw exist: a send to one of them is a single statement."""

    _now_param: Callable[[], datetime | None]

    def message_insert_many(
        self,
        *,
        messages: Sequence[NewMessage],
        subscription: str | None,
        conn: Any = None,
        max_copies: int | None = None,
    ) -> InsertResult:
        plan = self._insert_plan(messages, subscription, self._now_param(), max_copies)
        if conn is None and self._one_statement(messages, subscription):
            # One statement: autocommit is its own transaction.
            with self._db.connection(write=True) as c:
                return run_plan(c, plan)
        with self._db.transaction(conn) as c:
            return run_plan(c, plan)

    def _one_statement(self, messages: Sequence[NewMessage], subscription: str | None) -> bool:
        """Whether the publish is a single statement (no keys to reserve or lock, a queue
        this process knows exists), which needs no transaction of its own."""
        return (subscription is None or subscription in self._known_queues) and not any(
            m.idempotency_key is not None or m.ordering_key is not None for m in messages
        )

    async def message_insert_many_async(
        self,
        *,
        messages: Sequence[NewMessage],
        subscription: str | None,
        conn: Any = None,
        max_copies: int | None = None,
    ) -> InsertResult:
        plan = self._insert_plan(messages, subscription, self._now_param(), max_copies)
        if conn is None and self._one_statement(messages, subscription):
            async with self._db.connection_async(write=True) as c:
                return await run_plan_async(c, plan)
        async with self._db.transaction_async(conn) as c:
            return await run_plan_async(c, plan)

    def _insert_plan(
        self,
        messages: Sequence[NewMessage],
        subscription: str | None,
        now: datetime | None,
        max_copies: int | None = None,
    ) -> StatementPlan[InsertResult]:
        """The statements of a publish, for :func:`run_plan` or :func:`run_plan_async` to
        run on a sync or an async connection inside one transaction."""
        keyed = [m for m in messages if m.idempotency_key is not None]
        ordering_keys = sorted({m.ordering_key for m in messages if m.ordering_key is not None})
        if ordering_keys:
            yield self._sql["key_lock"], {"keys": ordering_keys}
        originals = (yield from self._dedupe_plan(keyed, now)) if keyed else {}
        fresh = [m for m in messages if m.message_id not in originals]
        unrouted = 0
        if fresh:
            if subscription is not None:
                check_copies(len(fresh), len(messages), max_copies)
                if subscription not in self._known_queues:
                    yield from self._queue_create_plan(subscription, now)
            # A queue publish without ordering keys needs no routing (message_insert_queue).
            variant = "_queue" if subscription is not None and not ordering_keys else ""
            params = self._insert_params(fresh, subscription, now)
            params["max_copies"] = _UNLIMITED if max_copies is None else max_copies
            if len(fresh) == 1:
                statement = self._sql[f"message_insert{variant}_one"]
                params = {
                    name: value[0] if isinstance(value, list) else value
                    for name, value in params.items()
                }
            else:
                statement = self._sql[f"message_insert{variant}"]
            rows = yield statement, params
            if subscription is not None:
                self._remember_queue(subscription)
            unrouted = int(rows[0][0]) if rows else 0
            if variant == "" and rows:
                check_copies(int(rows[0][2]), len(messages), max_copies)
        return InsertResult(
            message_ids=[originals.get(m.message_id, m.message_id) for m in messages],
            duplicates=len(originals),
            unrouted=unrouted,
        )

    def _queue_create_plan(self, name: str, now: datetime | None) -> StatementPlan[bool]:
        """The first send of this process to a queue: create it when it does not exist, and
        check the limits on subscriptions and patterns (the error rolls the creation back).
        Later sends leave the queue to the insert statement alone (one round trip)."""
        created = yield (
            self._sql["queue_create"],
            {"name": name, "regex": pattern_regex(name), "now": now},
        )
        if created:
            ((own, subscriptions, patterns),) = yield (
                self._sql["subscription_room"],
                {"name": name},
            )
            self.limits.check_room(
                subscription=name, own_patterns=own, subscriptions=subscriptions, patterns=patterns
            )
        return bool(created)

    def _remember_queue(self, name: str) -> None:
        """After a statement that needs the queue succeeded: later sends skip the check."""
        if len(self._known_queues) >= _KNOWN_QUEUES:
            self._known_queues.clear()
        self._known_queues.add(name)

    def _insert_params(
        self, messages: Sequence[NewMessage], subscription: str | None, now: datetime | None
    ) -> dict[str, Any]:
        return {
            "now": now,
            "subscription": subscription,
            "queue_regex": None if subscription is None else pattern_regex(subscription),
            "channel": self.notify_channel,
            "message_id": [m.message_id for m in messages],
            "topic": [m.topic for m in messages],
            "priority": [m.priority for m in messages],
            "ordering_key": [m.ordering_key for m in messages],
            "idempotency_key": [m.idempotency_key for m in messages],
            "payload": [m.payload for m in messages],
            "content_type": [m.content_type for m in messages],
            "headers": [m.headers for m in messages],
            "max_attempts": [m.max_attempts for m in messages],
            "at": [m.available_at for m in messages],
            "delay": [_float_or_none(m.delay) for m in messages],
            "expires": [m.expires_at for m in messages],
            "ttl": [_float_or_none(m.ttl) for m in messages],
        }

    def _dedupe_plan(
        self, keyed: Sequence[NewMessage], now: datetime | None
    ) -> StatementPlan[dict[str, str]]:
        """Reserve idempotency keys; map each duplicate's message id to the original's id.

        Raises ``IdempotencyConflict`` (rolling the transaction back) when a live key was
        used for a different payload. Repeats inside the batch are settled here first,
        because one INSERT … ON CONFLICT cannot touch the same row twice.
        """
        originals: dict[str, str] = {}
        first: dict[tuple[str, str], NewMessage] = {}
        for message in keyed:
            assert message.idempotency_key is not None
            slot = (message.topic, message.idempotency_key)
            if slot in first:
                if first[slot].payload_hash != message.payload_hash:
                    raise IdempotencyConflict(
                        message.topic, message.idempotency_key, first[slot].message_id
                    )
                originals[message.message_id] = first[slot].message_id
            else:
                first[slot] = message
        unique = list(first.values())
        reserved = {
            (topic, key)
            for topic, key in (
                yield (
                    self._sql["dedupe_reserve"],
                    {
                        "now": now,
                        "topic": [m.topic for m in unique],
                        "idempotency_key": [m.idempotency_key for m in unique],
                        "message_id": [m.message_id for m in unique],
                        "payload_hash": [m.payload_hash for m in unique],
                        "window": [float(m.dedupe_window) for m in unique],
                    },
                )
            )
        }
        taken = [m for m in unique if (m.topic, m.idempotency_key) not in reserved]
        if taken:
            rows = yield (
                self._sql["dedupe_get"],
                {
                    "topic": [m.topic for m in taken],
                    "idempotency_key": [m.idempotency_key for m in taken],
                },
            )
            existing = {
                (topic, key): (message_id, digest) for topic, key, message_id, digest in rows
            }
            for message in taken:
                assert message.idempotency_key is not None
                message_id, digest = existing[(message.topic, message.idempotency_key)]
                if digest != message.payload_hash:
                    raise IdempotencyConflict(message.topic, message.idempotency_key, message_id)
                originals[message.message_id] = message_id
        for message in keyed:
            original = originals.get(first[(message.topic, message.idempotency_key)].message_id)  # type: ignore[index]
            if original is not None:
                originals[message.message_id] = original
        return originals
