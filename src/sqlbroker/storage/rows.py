"""Shared helpers for turning database rows into the core row dataclasses."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlbroker.core.message import (
    ArchivedMessage,
    DeadLetter,
    Delivery,
    ErrorInfo,
    Outcome,
    PendingMessage,
    State,
    Subscription,
)
from sqlbroker.core.serde import decode_payload, encode_json


def utc(value: Any) -> datetime:
    """A database time (aware datetime or Unix seconds) as an aware UTC datetime."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromtimestamp(float(value), UTC)


def utc_or_none(value: Any) -> datetime | None:
    return None if value is None else utc(value)


def headers_of(text: str | None) -> dict[str, str]:
    return {} if not text else dict(json.loads(text))


def payload_of(data: Any, content_type: str) -> Any:
    return decode_payload(bytes(data), content_type)


def payload_hash(payload: bytes, content_type: str) -> str:
    """What makes two publishes with one idempotency key "the same message"."""
    digest = hashlib.sha256()
    digest.update(content_type.encode())
    digest.update(b"\x00")
    digest.update(payload)
    return digest.hexdigest()


def error_json(error: ErrorInfo | None) -> str | None:
    if error is None:
        return None
    return encode_json({"type": error.type, "message": error.message})


def batched(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


Row = Mapping[str, Any]
"""A result row addressable by column name (``sqlite3.Row`` or psycopg's ``dict_row``)."""


CLAIM_COLUMNS = (
    "id",
    "message_id",
    "subscription",
    "topic",
    "payload",
    "content_type",
    "headers",
    "priority",
    "ordering_key",
    "idempotency_key",
    "attempts",
    "max_attempts",
    "replay_count",
    "enqueued_at",
    "available_at",
    "expires_at",
    "lease_token",
    "lease_expires_at",
)
"""The columns a claim returns, in this order (a conformance test checks both backends)."""


def _utc_fast(value: Any) -> datetime:
    if isinstance(value, datetime) and value.tzinfo is UTC:
        return value
    return utc(value)


def delivery_of(row: Sequence[Any]) -> Delivery:
    """A claimed row (:data:`CLAIM_COLUMNS`, by position: claims are the hot path, and a
    tuple row skips building a mapping per row)."""
    (
        id_,
        message_id,
        subscription,
        topic,
        payload,
        content_type,
        headers,
        priority,
        ordering_key,
        idempotency_key,
        attempts,
        max_attempts,
        replay_count,
        enqueued_at,
        available_at,
        expires_at,
        lease_token,
        lease_expires_at,
    ) = row
    return Delivery(
        id=id_,
        message_id=str(message_id),
        subscription=subscription,
        topic=topic,
        payload=decode_payload(payload, content_type),
        content_type=content_type,
        headers=headers_of(headers),
        priority=priority,
        key=ordering_key,
        idempotency_key=idempotency_key,
        attempt=attempts,
        max_attempts=max_attempts,
        replay_count=replay_count,
        enqueued_at=_utc_fast(enqueued_at),
        available_at=_utc_fast(available_at),
        expires_at=None if expires_at is None else _utc_fast(expires_at),
        lease_token=str(lease_token),
        lease_expires_at=_utc_fast(lease_expires_at),
    )


def pending_of(row: Row) -> PendingMessage:
    return PendingMessage(
        id=row["id"],
        message_id=str(row["message_id"]),
        subscription=row["subscription"],
        topic=row["topic"],
        state=State(row["state"]),
        priority=row["priority"],
        key=row["ordering_key"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        enqueued_at=utc(row["enqueued_at"]),
        available_at=utc(row["available_at"]),
        expires_at=utc_or_none(row["expires_at"]),
        lease_expires_at=utc_or_none(row["lease_expires_at"]),
        last_error=row["last_error"],
    )


def dead_letter_of(row: Row) -> DeadLetter:
    return DeadLetter(
        id=row["id"],
        message_id=str(row["message_id"]),
        subscription=row["subscription"],
        topic=row["topic"],
        payload=payload_of(row["payload"], row["content_type"]),
        content_type=row["content_type"],
        headers=headers_of(row["headers"]),
        priority=row["priority"],
        key=row["ordering_key"],
        idempotency_key=row["idempotency_key"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        replay_count=row["replay_count"],
        reason=row["reason"],
        error_type=row["error_type"],
        error_message=row["error_message"],
        traceback=row["traceback"],
        enqueued_at=utc(row["enqueued_at"]),
        first_started_at=utc_or_none(row["first_started_at"]),
        first_failed_at=utc(row["first_failed_at"]),
        last_failed_at=utc(row["last_failed_at"]),
        dead_at=utc(row["dead_at"]),
    )


def archived_of(row: Row) -> ArchivedMessage:
    return ArchivedMessage(
        id=row["id"],
        message_id=str(row["message_id"]),
        subscription=row["subscription"],
        topic=row["topic"],
        payload=payload_of(row["payload"], row["content_type"]),
        content_type=row["content_type"],
        headers=headers_of(row["headers"]),
        priority=row["priority"],
        key=row["ordering_key"],
        outcome=Outcome(row["outcome"]),
        attempts=row["attempts"],
        replay_count=row["replay_count"],
        enqueued_at=utc(row["enqueued_at"]),
        first_started_at=utc_or_none(row["first_started_at"]),
        finished_at=utc(row["finished_at"]),
    )


def subscriptions_of(rows: Iterable[Row]) -> list[Subscription]:
    """Group ``(name, created_at, pattern)`` rows, one per pattern, into subscriptions."""
    grouped: dict[str, tuple[Any, list[str]]] = {}
    for row in rows:
        _, patterns = grouped.setdefault(row["name"], (row["created_at"], []))
        if row["pattern"] is not None:
            patterns.append(row["pattern"])
    return [
        Subscription(name=name, patterns=tuple(patterns), created_at=utc(created))
        for name, (created, patterns) in grouped.items()
    ]
