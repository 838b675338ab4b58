"""What the schedule operations of the storage seam take and return.

Shared by both backends' schedule mixins; see the "schedules" section of
:class:`sqlbroker.storage.base.Backend` for the contracts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlbroker.core.message import NewMessage
from sqlbroker.core.schedules import Missed
from sqlbroker.storage import columns as convert
from sqlbroker.storage.columns import EPOCH, Columns, decode_headers, utc, utc_or_none
from sqlbroker.storage.rows import Row

log = logging.getLogger("sqlbroker.storage")


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
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns; ``None`` for a sound row.
    A damaged schedule is listed but never fired (:func:`due_records`)."""


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
    columns = Columns(row)
    text, text_or_none = convert.text, convert.text_or_none
    return ScheduleRecord(
        name=columns.get("name", text, ""),
        topic=columns.get("topic", text, ""),
        cron=columns.get("cron", text_or_none, None),
        every=columns.get("every_seconds", convert.number_or_none, None),
        tz=columns.get("tz", text, "UTC"),
        missed=columns.get("missed", Missed, Missed.LATEST),
        grace=columns.get("grace_seconds", convert.number, 0.0),
        start_at=columns.get("start_at", utc_or_none, None),
        anchor_at=columns.get("anchor_at", utc_or_none, None),
        payload=columns.get("payload", convert.payload_bytes, b""),
        content_type=columns.get("content_type", text, ""),
        headers=columns.get("headers", _headers_text, None),
        priority=columns.get("priority", convert.integer, 0),
        ordering_key=columns.get("ordering_key", text_or_none, None),
        ttl=columns.get("ttl_seconds", convert.number_or_none, None),
        max_attempts=columns.get("max_attempts", convert.integer, 1),
        definition_hash=columns.get("definition_hash", text, ""),
        next_run_at=columns.get("next_run_at", utc, EPOCH),
        last_run_at=columns.get("last_run_at", utc_or_none, None),
        last_message_id=columns.get("last_message_id", _id_or_none, None),
        paused=bool(columns.raw("paused")),
        created_at=columns.get("created_at", utc, EPOCH),
        updated_at=columns.get("updated_at", utc, EPOCH),
        damaged=columns.damaged,
    )


def _headers_text(value: Any) -> str | None:
    decode_headers(value)
    return None if value is None else str(value)


def _id_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def due_records(found: Sequence[Row]) -> list[ScheduleRecord]:
    """Due schedule rows as records, leaving out (with a warning) those that do not decode:
    a damaged schedule must not publish stand-in values, nor stop the others."""
    records = []
    for row in found:
        record = schedule_record_of(row)
        if record.damaged is None:
            records.append(record)
        else:
            log.warning(
                "schedule %s does not decode (%s): not fired",
                record.name,
                record.damaged,
                extra={"schedule": record.name},
            )
    return records


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
