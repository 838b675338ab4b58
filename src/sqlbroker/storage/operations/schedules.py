"""Schedules: definitions, the due scan and the compare-and-set that fires a tick once
(see :mod:`sqlbroker.features.schedules`; the types are in :mod:`sqlbroker.storage.schedules`).

Firing is three steps in one transaction (:func:`fire_many`): :func:`_advance` moves each
schedule on by compare-and-set, the won ticks' messages are published, and
:func:`_published` points each schedule at the message of its last tick.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlbroker.storage.columns import Columns, decode_headers, integer, record_of, text, utc
from sqlbroker.storage.operations.publishing import message_insert_many
from sqlbroker.storage.plan import Plan, atomic, changed, named, query, reads
from sqlbroker.storage.schedules import (
    DueSchedules,
    ScheduleDefinition,
    ScheduleFire,
    ScheduleRecord,
)

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings

log = logging.getLogger("sqlbroker.storage")


def upsert(settings: Settings, *, definition: ScheduleDefinition) -> Plan[ScheduleRecord]:
    """Create the schedule, or redefine the one of that name. An identical definition
    changes nothing; one with the same timing keeps its next run and anchor; any other
    takes ``next_run_at`` and ``anchor_at`` from ``definition``. Pausing survives."""
    yield query("schedule_upsert", **asdict(definition))
    rows = yield named("schedule_list", names=[definition.name])
    return schedule_record_of(rows[0])


@reads
def list_(settings: Settings, *, names: Sequence[str] | None) -> Plan[list[ScheduleRecord]]:
    """The named schedules (all with ``None``), by name."""
    rows = yield named("schedule_list", names=None if names is None else list(names))
    return [schedule_record_of(row) for row in rows]


def delete(settings: Settings, *, name: str) -> Plan[bool]:
    return changed("schedule_delete", name=name)


def set_paused(
    settings: Settings, *, name: str, paused: bool, next_run_at: datetime | None
) -> Plan[bool]:
    """Pause, or resume with ``next_run_at`` (a paused schedule only: resuming a running
    one changes nothing). Returns whether the schedule exists."""
    return changed("schedule_set_paused", name=name, paused=paused, next_run_at=next_run_at)


@reads
def due(settings: Settings, *, limit: int) -> Plan[DueSchedules]:
    """Up to ``limit`` schedules, not paused, whose next run is at or before the storage
    clock's now, earliest first; and the earliest next run of the others. One statement,
    so that the caller plans against the very time that made them due."""
    rows = yield named("schedule_due", limit=limit)
    earliest = rows[0]["clock_next_run"]
    return DueSchedules(
        now=utc(rows[0]["clock_now"]),
        due=due_records([row for row in rows if row["name"] is not None]),
        next_run_at=None if earliest is None else utc(earliest),
    )


def _advance(settings: Settings, *, fires: Sequence[ScheduleFire]) -> Plan[list[ScheduleFire]]:
    """Move each schedule from its expected next run on, provided it still has that next
    run and definition and is not paused; return the fires that won. Schedules are taken
    in one order (by name), so that two schedulers' batches never wait on each other."""
    won: list[ScheduleFire] = []
    for fire in sorted(fires, key=lambda fire: fire.name):
        done = yield query(
            "schedule_advance",
            name=fire.name,
            next_run_at=fire.next_run_at,
            last_run_at=fire.last_run_at,
            last_message_id=fire.messages[-1].message_id if fire.messages else None,
            expected_next_run_at=fire.expected_next_run_at,
            definition_hash=fire.definition_hash,
        )
        if done.rowcount == 1:
            won.append(fire)
    return won


def _published(
    settings: Settings, *, fires: Sequence[ScheduleFire], message_ids: Sequence[str]
) -> Plan[dict[str, list[str]]]:
    """The message ids of each won fire (``message_ids``: the publish of all their
    messages, in order). Where a tick's idempotency key was taken already, the id is
    that earlier message's: the schedule's last message points at it."""
    fired: dict[str, list[str]] = {}
    position = 0
    for fire in fires:
        ids = list(message_ids[position : position + len(fire.messages)])
        position += len(fire.messages)
        if ids and ids[-1] != fire.messages[-1].message_id:
            yield query("schedule_last_message", name=fire.name, last_message_id=ids[-1])
        fired[fire.name] = ids
    return fired


@atomic
def fire_many(settings: Settings, *, fires: Sequence[ScheduleFire]) -> Plan[dict[str, list[str]]]:
    """In one transaction: for each fire, advance its schedule by compare-and-set on
    (next run, definition, not paused) and, only when that succeeded, publish its
    messages as ``message_insert_many`` would. Returns the published message ids of each
    schedule that advanced; a fire that lost the race is left out."""
    if not fires:
        return {}
    won = yield from _advance(settings, fires=fires)
    messages = [message for fire in won for message in fire.messages]
    ids: list[str] = []
    if messages:
        inserted = yield from message_insert_many(settings, messages=messages, subscription=None)
        ids = inserted.message_ids
    return (yield from _published(settings, fires=won, message_ids=ids))


def schedule_record_of(row: Any) -> ScheduleRecord:
    """A schedule row (see :func:`~sqlbroker.storage.columns.record_of`); headers stay the
    stored JSON text, checked; a damaged time zone stands in as UTC, attempts as 1."""
    return record_of(
        ScheduleRecord,
        Columns(row),
        tz=lambda columns: columns.get("tz", text, "UTC"),
        headers=lambda columns: columns.get("headers", _headers_text, None),
        max_attempts=lambda columns: columns.get("max_attempts", integer, 1),
        last_message_id=lambda columns: columns.get("last_message_id", _id_or_none, None),
    )


def _headers_text(value: Any) -> str | None:
    decode_headers(value)
    return None if value is None else str(value)


def _id_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def due_records(found: Sequence[Any]) -> list[ScheduleRecord]:
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
