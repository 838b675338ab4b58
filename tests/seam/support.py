"""Building blocks for the seam suite: messages straight into a backend."""

from __future__ import annotations

import uuid
from typing import Any

from sqlbroker.core.message import Delivery, NewMessage
from sqlbroker.core.serde import encode_json


def new_message(topic: str, payload: Any = None, *, key: str | None = None) -> NewMessage:
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
        max_attempts=5,
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
