"""Building blocks for the seam suite: messages straight into a backend."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from sqlbroker.core.message import Delivery, NewMessage
from sqlbroker.core.serde import encode_json


def new_message(
    topic: str, payload: Any = None, *, key: str | None = None, max_attempts: int = 5
) -> NewMessage:
    return NewMessage(
        message_id=str(uuid.uuid4()),
        topic=topic,
        payload=encode_json(payload if payload is not None else {"topic": topic}).encode(),
        content_type="application/json",
        headers=None,
        priority=0,
        ordering_key=key,
        idempotency_key=None,
        payload_hash=None,
        delay=None,
        available_at=None,
        ttl=None,
        expires_at=None,
        max_attempts=max_attempts,
        dedupe_window=0.0,
    )


def publish(backend: Any, queue: str, count: int = 1, *, key: str | None = None) -> list[str]:
    messages = [new_message(queue, {"n": n}, key=key) for n in range(count)]
    return list(backend.message_insert_many(messages=messages, subscription=queue).message_ids)


def claim(backend: Any, queue: str, limit: int = 10) -> list[Delivery]:
    deliveries: list[Delivery] = backend.message_claim_many(
        subscription=queue, limit=limit, lease=30, worker="seam-test"
    )
    return deliveries


def lock_waits(admin: psycopg.Connection[Any]) -> int:
    """PostgreSQL: how many sessions of this database wait for a lock now."""
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


async def cancel_while_locked(admin_url: str, start: Callable[[], Awaitable[Any]]) -> None:
    """PostgreSQL: run ``start()`` while another session holds the message table, cancel it
    once its statement waits for the lock, and check that the server stopped the statement
    (no session is left waiting for the lock) before the lock is let go."""
    with (
        psycopg.connect(admin_url) as locker,
        psycopg.connect(admin_url, autocommit=True) as admin,
    ):
        locker.execute("LOCK TABLE sqlbroker_message IN EXCLUSIVE MODE")
        task = asyncio.ensure_future(start())
        while lock_waits(admin) == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(1000):  # the cancel request reaches the server
            if lock_waits(admin) == 0:
                break
            await asyncio.sleep(0.01)
        assert lock_waits(admin) == 0
