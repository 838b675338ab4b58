"""What the schedule operations of the storage seam take and return.

The operations are in :mod:`sqlbroker.storage.operations.schedules`; see the
"schedules" section of :class:`sqlbroker.storage.seam.Executor`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlbroker.core.message import NewMessage
from sqlbroker.core.schedules import Missed


@dataclass(frozen=True, slots=True)
class ScheduleFields:
    """What a definition on its way into storage and a stored schedule both hold."""

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


@dataclass(frozen=True, slots=True)
class ScheduleDefinition(ScheduleFields):
    """A validated, encoded schedule definition on its way into storage.

    ``timing_hash`` identifies what makes the ticks (cron or interval, time zone, start);
    ``definition_hash`` identifies everything. Storing a definition with the same
    ``timing_hash`` keeps the stored next run; another one takes ``anchor_at`` and
    ``next_run_at`` from here. Its fields are the parameters of the ``schedule_upsert``
    SQL block, by name.
    """

    timing_hash: str


@dataclass(frozen=True, slots=True)
class ScheduleRecord(ScheduleFields):
    """A stored schedule as storage returns it (payload still encoded)."""

    last_run_at: datetime | None
    last_message_id: str | None
    paused: bool
    created_at: datetime
    updated_at: datetime
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns; ``None`` for a sound row.
    A damaged schedule is listed but never fired."""


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
