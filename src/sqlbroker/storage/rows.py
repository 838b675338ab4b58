"""Turning database rows into the core row dataclasses, never raising.

Every ``*_of`` function reads a row column by column through
:class:`~sqlbroker.storage.columns.Columns`: a column that does not decode takes a stand-in
value and is named in the row's ``damaged`` text, so a listing shows the row (by its id)
as damaged instead of failing, and a claim dead-letters it (:func:`deliveries_of`).
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
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
    thawed,
)
from sqlbroker.core.observability import (
    AuditEntry,
    MinuteCounts,
    RareCount,
    WorkerInfo,
)
from sqlbroker.core.serde import decode_payload, encode_json
from sqlbroker.core.topics import validate_pattern
from sqlbroker.storage.columns import (
    NEGATIVE_INFINITY,
    POSITIVE_INFINITY,
    Columns,
    buckets,
    decode_headers,
    integer,
    json_object,
    number,
    payload_bytes,
    payload_column,
    strings,
    text,
    text_or_none,
    time_of,
    time_or_none_of,
    utc,
    uuid_text,
)


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
    if (
        isinstance(value, datetime)
        and value.tzinfo is UTC
        and value is not POSITIVE_INFINITY
        and value is not NEGATIVE_INFINITY
    ):
        return value
    return utc(value)


def delivery_of(row: Sequence[Any]) -> Delivery:
    """A claimed row (:data:`CLAIM_COLUMNS`, by position: claims are the hot path, and a
    tuple row skips building a mapping per row). Raises ``ValueError`` naming the columns
    when the row does not decode (see :func:`deliveries_of`)."""
    try:
        return _delivery_fast(row)
    except Exception:  # anything a damaged value causes; the slow path names the columns
        pass
    columns = Columns(row, CLAIM_COLUMNS)
    content_type = columns.get("content_type", text, "")
    payload = columns.get("payload", payload_bytes, b"")
    delivery = Delivery(
        id=columns.raw("id"),
        message_id=columns.get("message_id", uuid_text, ""),
        subscription=columns.get("subscription", text, ""),
        topic=columns.get("topic", text, ""),
        payload=decode_payload(payload, content_type),
        content_type=content_type,
        headers=columns.get("headers", decode_headers, {}),
        priority=columns.get("priority", integer, 0),
        key=columns.get("ordering_key", text_or_none, None),
        idempotency_key=columns.get("idempotency_key", text_or_none, None),
        attempt=columns.get("attempts", integer, 0),
        max_attempts=columns.get("max_attempts", integer, 0),
        replay_count=columns.get("replay_count", integer, 0),
        enqueued_at=time_of(columns, "enqueued_at"),
        available_at=time_of(columns, "available_at"),
        expires_at=time_or_none_of(columns, "expires_at"),
        lease_token=columns.get("lease_token", uuid_text, ""),
        lease_expires_at=time_of(columns, "lease_expires_at"),
    )
    if columns.damaged is not None:
        raise ValueError(columns.damaged)
    return delivery  # the fast path failed on something the slow path accepts


_Unfrozen = thawed(Delivery)
"""What :func:`_delivery_fast` fills in before it is a ``Delivery``: the frozen ``__init__``
costs ~28k instructions per claimed copy (CPython 3.11), this way ~6k. Tests compare the
fast path with the slow one field by field (a field it fails to set stays an empty slot)."""


def _delivery_fast(row: Sequence[Any]) -> Delivery:
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
    if (
        type(priority) is not int
        or type(attempts) is not int
        or type(max_attempts) is not int
        or type(replay_count) is not int
        or type(topic) is not str
        or type(subscription) is not str
        or type(content_type) is not str
        or lease_token is None
    ):
        raise ValueError("a column has the wrong type")
    delivery: Any = _Unfrozen()
    delivery.id = id_
    delivery.message_id = str(message_id)
    delivery.subscription = subscription
    delivery.topic = topic
    delivery.payload = decode_payload(payload, content_type)
    delivery.content_type = content_type
    delivery.headers = decode_headers(headers)
    delivery.priority = priority
    delivery.key = ordering_key
    delivery.idempotency_key = idempotency_key
    delivery.attempt = attempts
    delivery.max_attempts = max_attempts
    delivery.replay_count = replay_count
    delivery.enqueued_at = _utc_fast(enqueued_at)
    delivery.available_at = _utc_fast(available_at)
    delivery.expires_at = None if expires_at is None else _utc_fast(expires_at)
    delivery.lease_token = str(lease_token)
    delivery.lease_expires_at = _utc_fast(lease_expires_at)
    delivery.__class__ = Delivery
    return delivery  # type: ignore[no-any-return]


UNDECODABLE = "undecodable"
"""The dead-letter reason of a claimed row that does not decode."""


@dataclass(frozen=True, slots=True)
class UndecodableRow:
    """A claimed row that does not decode: its id, the lease token the claim issued and
    what is wrong (the columns named)."""

    id: int
    lease_token: str
    problem: str

    @property
    def error(self) -> ErrorInfo:
        return ErrorInfo(type="sqlbroker.Undecodable", message=self.problem)

    @property
    def reason(self) -> str:
        return f"{UNDECODABLE}: {self.problem}"


_URGENCY = operator.attrgetter("priority", "available_at", "id")
"""Most urgent first: the order a claim hands its copies out in."""


def deliveries_of(rows: Iterable[Sequence[Any]]) -> tuple[list[Delivery], list[UndecodableRow]]:
    """Claimed rows as deliveries (most urgent first), and the rows that do not decode.
    The caller dead-letters those (reason ``undecodable``) under the lease the claim just
    issued, so a damaged row never reaches a handler and never comes back to crash the
    next claim."""
    deliveries: list[Delivery] = []
    damaged: list[UndecodableRow] = []
    for row in rows:
        try:
            deliveries.append(delivery_of(row))
        except ValueError as error:
            token = row[CLAIM_COLUMNS.index("lease_token")]
            damaged.append(UndecodableRow(id=row[0], lease_token=str(token), problem=str(error)))
    deliveries.sort(key=_URGENCY)
    return deliveries, damaged


def pending_of(row: Row) -> PendingMessage:
    columns = Columns(row)
    return PendingMessage(
        id=row["id"],
        message_id=columns.get("message_id", uuid_text, ""),
        subscription=columns.get("subscription", text, ""),
        topic=columns.get("topic", text, ""),
        state=columns.get("state", State, State.AVAILABLE),
        priority=columns.get("priority", integer, 0),
        key=columns.get("ordering_key", text_or_none, None),
        attempts=columns.get("attempts", integer, 0),
        max_attempts=columns.get("max_attempts", integer, 0),
        enqueued_at=time_of(columns, "enqueued_at"),
        available_at=time_of(columns, "available_at"),
        expires_at=time_or_none_of(columns, "expires_at"),
        lease_expires_at=time_or_none_of(columns, "lease_expires_at"),
        last_error=columns.get("last_error", text_or_none, None),
        damaged=columns.damaged,  # last: after every column above was read
    )


def dead_letter_of(row: Row) -> DeadLetter:
    columns = Columns(row)
    return DeadLetter(
        id=row["id"],
        message_id=columns.get("message_id", uuid_text, ""),
        subscription=columns.get("subscription", text, ""),
        topic=columns.get("topic", text, ""),
        payload=payload_column(columns),
        content_type=columns.get("content_type", text, ""),
        headers=columns.get("headers", decode_headers, {}),
        priority=columns.get("priority", integer, 0),
        key=columns.get("ordering_key", text_or_none, None),
        idempotency_key=columns.get("idempotency_key", text_or_none, None),
        attempts=columns.get("attempts", integer, 0),
        max_attempts=columns.get("max_attempts", integer, 0),
        replay_count=columns.get("replay_count", integer, 0),
        reason=columns.get("reason", text, ""),
        error_type=columns.get("error_type", text_or_none, None),
        error_message=columns.get("error_message", text_or_none, None),
        traceback=columns.get("traceback", text_or_none, None),
        enqueued_at=time_of(columns, "enqueued_at"),
        first_started_at=time_or_none_of(columns, "first_started_at"),
        first_failed_at=time_of(columns, "first_failed_at"),
        last_failed_at=time_of(columns, "last_failed_at"),
        dead_at=time_of(columns, "dead_at"),
        damaged=columns.damaged,
    )


def archived_of(row: Row) -> ArchivedMessage:
    columns = Columns(row)
    return ArchivedMessage(
        id=row["id"],
        message_id=columns.get("message_id", uuid_text, ""),
        subscription=columns.get("subscription", text_or_none, None),
        topic=columns.get("topic", text, ""),
        payload=payload_column(columns),
        content_type=columns.get("content_type", text, ""),
        headers=columns.get("headers", decode_headers, {}),
        priority=columns.get("priority", integer, 0),
        key=columns.get("ordering_key", text_or_none, None),
        outcome=columns.get("outcome", Outcome, Outcome.COMPLETED),
        attempts=columns.get("attempts", integer, 0),
        replay_count=columns.get("replay_count", integer, 0),
        enqueued_at=time_of(columns, "enqueued_at"),
        first_started_at=time_or_none_of(columns, "first_started_at"),
        finished_at=time_of(columns, "finished_at"),
        damaged=columns.damaged,
    )


def subscriptions_of(rows: Iterable[Row]) -> list[Subscription]:
    """Group ``(name, created_at, pattern)`` rows, one per pattern, into subscriptions; a
    stored pattern that is not a valid pattern (routing ignores it) marks its subscription
    damaged."""
    grouped: dict[str, tuple[Columns, list[str]]] = {}
    for row in rows:
        columns, patterns = grouped.setdefault(row["name"], (Columns(row), []))
        pattern = row["pattern"]
        if pattern is not None:
            try:
                patterns.append(validate_pattern(pattern))
            except ValueError:
                columns.note("pattern", f"{str(pattern)[:80]!r} is not a valid pattern")
    found = []
    for name, (columns, patterns) in grouped.items():
        created = time_of(columns, "created_at")
        found.append(
            Subscription(
                name=name, patterns=tuple(patterns), created_at=created, damaged=columns.damaged
            )
        )
    return found


def worker_of(row: Row) -> WorkerInfo:
    """A worker row; one that does not decode counts as stopped long ago (never alive)."""
    columns = Columns(row)
    worker = WorkerInfo(
        name=columns.get("name", text, ""),
        host=columns.get("host", text, ""),
        pid=columns.get("pid", integer, 0),
        subscriptions=columns.get("subscriptions", strings, ()),
        started_at=time_of(columns, "started_at"),
        seen_at=time_of(columns, "seen_at"),
        stopped_at=time_or_none_of(columns, "stopped_at"),
        seen_age=columns.get("seen_age", number, math.inf),
        damaged=columns.damaged,  # last: after every column above was read
    )
    return worker if worker.damaged is None else replace(worker, seen_age=math.inf)


def minute_of(row: Row) -> MinuteCounts | None:
    """A per-minute counter row, or ``None`` when it does not decode (a metric cannot show
    a damaged row; it leaves it out)."""
    columns = Columns(row)
    minute = MinuteCounts(
        subscription=columns.get("subscription", text, ""),
        minute=time_of(columns, "minute"),
        worker=columns.get("worker", text, ""),
        completed=columns.get("completed", integer, 0),
        retried=columns.get("retried", integer, 0),
        dead=columns.get("dead", integer, 0),
        handler_count=columns.get("handler_count", integer, 0),
        handler_seconds=columns.get("handler_seconds", number, 0.0),
        handler_buckets=columns.get("handler_buckets", buckets, []),
    )
    return None if columns.damaged is not None else minute


def totals_of(rows: Iterable[Row]) -> dict[tuple[str, str], int]:
    """Lifetime counters by ``(subscription, outcome)``, leaving out rows that do not
    decode."""
    totals: dict[tuple[str, str], int] = {}
    for row in rows:
        columns = Columns(row)
        key = (columns.get("subscription", text, ""), columns.get("outcome", text, ""))
        count = columns.get("count", integer, 0)
        if columns.damaged is None:
            totals[key] = count
    return totals


def rare_count_of(row: Row) -> RareCount:
    columns = Columns(row)
    return RareCount(
        subscription=columns.get("subscription", text_or_none, None),
        outcome=columns.get("outcome", text, ""),
        total=columns.get("total", integer, 0),
        recent=columns.get("recent", integer, 0),
    )


def audit_of(row: Row) -> AuditEntry:
    columns = Columns(row)
    return AuditEntry(
        id=row["id"],
        at=time_of(columns, "at"),
        actor=columns.get("actor", text, ""),
        action=columns.get("action", text, ""),
        detail=columns.get("detail", json_object, {}),
        damaged=columns.damaged,
    )
