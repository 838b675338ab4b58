"""Turning database rows into the core row dataclasses, never raising.

Every ``*_of`` function reads a row column by column through
:class:`~sqlbroker.storage.columns.Columns` (most by
:func:`~sqlbroker.storage.columns.record_of`, each field by its type): a column that does
not decode takes a stand-in value and is named in the row's ``damaged`` text, so a listing
shows the row (by its id) as damaged instead of failing, and a claim dead-letters it
(:func:`deliveries_of`).
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
    PendingMessage,
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
    EPOCH,
    NEGATIVE_INFINITY,
    POSITIVE_INFINITY,
    Columns,
    decode_headers,
    integer,
    payload_column,
    record_of,
    text,
    utc,
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
    delivery = record_of(Delivery, columns, id=_raw_id, payload=payload_column)
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
    return record_of(PendingMessage, Columns(row), id=_raw_id)


def dead_letter_of(row: Row) -> DeadLetter:
    return record_of(DeadLetter, Columns(row), id=_raw_id, payload=payload_column)


def archived_of(row: Row) -> ArchivedMessage:
    return record_of(ArchivedMessage, Columns(row), id=_raw_id, payload=payload_column)


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
        created = columns.get("created_at", utc, EPOCH)
        found.append(
            Subscription(
                name=name, patterns=tuple(patterns), created_at=created, damaged=columns.damaged
            )
        )
    return found


def worker_of(row: Row) -> WorkerInfo:
    """A worker row; one that does not decode counts as stopped long ago (never alive)."""
    worker = record_of(WorkerInfo, Columns(row))
    return worker if worker.damaged is None else replace(worker, seen_age=math.inf)


def minute_of(row: Row) -> MinuteCounts | None:
    """A per-minute counter row, or ``None`` when it does not decode (a metric cannot show
    a damaged row; it leaves it out)."""
    columns = Columns(row)
    minute = record_of(MinuteCounts, columns)
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
    return record_of(RareCount, Columns(row))


def audit_of(row: Row) -> AuditEntry:
    return record_of(AuditEntry, Columns(row), id=_raw_id)


def _raw_id(columns: Columns) -> Any:
    """A row's id as the database gave it (its primary key: sound in every row)."""
    return columns.raw("id")
