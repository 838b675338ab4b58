"""What the schedule operations of the storage seam take and return.

Shared by both backends' schedule mixins; see the "schedules" section of
:class:`sqlbroker.storage.base.Backend` for the contracts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlbroker.core.message import NewMessage
from sqlbroker.core.schedules import Missed
from sqlbroker.storage.rows import Row, utc, utc_or_none


@dataclass(frozen=True, slots=True)
class ScheduleDefinition:
    """A validated, encoded schedule definition on its way into storage.

    ``timing_hash`` identifies what makes the ticks (cron or interval, time zone, start);
    ``definition_hash`` identifies everything. Storing a definition with the same
    ``timing_hash`` keeps the stored next run; another one takes ``anchor_at`` and
    ``next_run_at`` from here.
    """

    name: str
    topic: str
    cron: str | None
    every: float | None
    tz: str
    missed: Missed
    grace: float
    start_at: datetime | None
    anchor_at: datetime | None
    payload: bytes
    content_type: str
    headers: str | None
    priority: int
    ordering_key: str | None
    ttl: float | None
    max_attempts: int
    definition_hash: str
    timing_hash: str
    next_run_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A stored schedule as storage returns it (payload still encoded)."""

    name: str
    topic: str
    cron: str | None
    every: float | None
    tz: str
    missed: Missed
    grace: float
    start_at: datetime | None
    anchor_at: datetime | None
    payload: bytes
    content_type: str
    headers: str | None
    priority: int
    ordering_key: str | None
    ttl: float | None
    max_attempts: int
    definition_hash: str
    next_run_at: datetime
    last_run_at: datetime | None
    last_message_id: str | None
    paused: bool
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduleFire:
    """Advance one schedule from ``expected_next_run_at`` to ``next_run_at`` and publish
    ``messages`` (one per tick, maybe none), provided the schedule still has that next run
    and that definition and is not paused."""

    name: str
    expected_next_run_at: datetime
    definition_hash: str
    next_run_at: datetime
    last_run_at: datetime | None
    messages: Sequence[NewMessage]


@dataclass(frozen=True, slots=True)
class DueSchedules:
    """The schedules due at ``now`` (the storage clock), and the earliest next run of the
    schedules neither paused nor due (``None`` when there is none)."""

    now: datetime
    due: list[ScheduleRecord]
    next_run_at: datetime | None


def schedule_record_of(row: Row) -> ScheduleRecord:
    return ScheduleRecord(
        name=row["name"],
        topic=row["topic"],
        cron=row["cron"],
        every=row["every_seconds"],
        tz=row["tz"],
        missed=Missed(row["missed"]),
        grace=float(row["grace_seconds"]),
        start_at=utc_or_none(row["start_at"]),
        anchor_at=utc_or_none(row["anchor_at"]),
        payload=bytes(row["payload"]),
        content_type=row["content_type"],
        headers=row["headers"],
        priority=row["priority"],
        ordering_key=row["ordering_key"],
        ttl=row["ttl_seconds"],
        max_attempts=row["max_attempts"],
        definition_hash=row["definition_hash"],
        next_run_at=utc(row["next_run_at"]),
        last_run_at=utc_or_none(row["last_run_at"]),
        last_message_id=None if row["last_message_id"] is None else str(row["last_message_id"]),
        paused=bool(row["paused"]),
        created_at=utc(row["created_at"]),
        updated_at=utc(row["updated_at"]),
    )


def definition_params(definition: ScheduleDefinition, *, times: Any) -> dict[str, Any]:
    """Named parameters of a definition; ``times`` converts a datetime for the driver."""

    def time_or_none(value: datetime | None) -> Any:
        return None if value is None else times(value)

    return {
        "name": definition.name,
        "topic": definition.topic,
        "cron": definition.cron,
        "every_seconds": definition.every,
        "tz": definition.tz,
        "missed": definition.missed.value,
        "grace_seconds": definition.grace,
        "start_at": time_or_none(definition.start_at),
        "anchor_at": time_or_none(definition.anchor_at),
        "payload": definition.payload,
        "content_type": definition.content_type,
        "headers": definition.headers,
        "priority": definition.priority,
        "ordering_key": definition.ordering_key,
        "ttl_seconds": definition.ttl,
        "max_attempts": definition.max_attempts,
        "definition_hash": definition.definition_hash,
        "timing_hash": definition.timing_hash,
        "next_run_at": times(definition.next_run_at),
    }
