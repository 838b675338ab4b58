"""Schedules: the public row, the missed-tick policies and the pure arithmetic of ticks.

A schedule publishes one message per *tick*. Ticks come from a :class:`TickSource`
(an interval here; cron expressions live in :mod:`sqlbroker.features.schedules`, which
imports croniter lazily). :func:`plan_ticks` decides, from the schedule's next run and the
database's current time, which due ticks to publish under the schedule's missed policy
and when it runs next. Nothing here does I/O; every time is an aware UTC datetime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

TICK_HEADER = "sqlbroker-tick"
"""Header of every tick message: the tick's time, ISO 8601 in UTC."""
SCHEDULE_HEADER = "sqlbroker-schedule"
"""Header of every tick message: the name of the schedule that published it."""
RESERVED_HEADERS = frozenset({TICK_HEADER, SCHEDULE_HEADER})

MAX_MISSED_TICKS = 1000
"""``missed="all"`` publishes at most this many of the most recent missed ticks at once."""
DEFAULT_GRACE = 60.0
"""Seconds after its time within which a tick still counts as on time, not missed."""
MIN_EVERY = 0.01
"""The shortest interval accepted, in seconds."""

_MICROSECOND = timedelta(microseconds=1)


class Missed(StrEnum):
    """What a schedule does with ticks that passed while no scheduler published them."""

    LATEST = "latest"
    """Publish once, for the most recent due tick; drop the older ones (the default)."""
    SKIP = "skip"
    """Publish none of the missed ticks; a due tick still within the grace period is on
    time and is published."""
    ALL = "all"
    """Publish every missed tick, oldest first; at most :data:`MAX_MISSED_TICKS` (the most
    recent ones) in one catch-up."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A durable schedule definition and its state, as :meth:`Broker.schedules` lists it."""

    name: str
    topic: str
    cron: str | None
    """The cron expression, or ``None`` for an interval schedule."""
    every: float | None
    """The interval in seconds, or ``None`` for a cron schedule."""
    tz: str
    missed: Missed
    grace: float
    start_at: datetime | None
    payload: Any
    content_type: str
    headers: Mapping[str, str]
    priority: int
    key: str | None
    ttl: float | None
    max_attempts: int
    next_run_at: datetime
    """When the next tick is due (kept while paused; recomputed on resume)."""
    last_run_at: datetime | None
    """The time of the last tick published, or ``None`` before the first."""
    last_message_id: str | None
    paused: bool
    created_at: datetime
    updated_at: datetime = field(compare=False)

    @property
    def spec(self) -> str:
        """``cron <expression>`` or ``every <seconds>s``: what makes the ticks."""
        if self.cron is not None:
            return f"cron {self.cron}"
        return f"every {self.every:g}s"


class TickSource(Protocol):
    """The ticks of one schedule, as aware UTC datetimes."""

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The last tick at or before ``moment``; ``None`` when there is none."""

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``."""


def first_at_or_after(source: TickSource, moment: datetime) -> datetime:
    """The first tick at or after ``moment``."""
    return source.next_after(moment - _MICROSECOND)


@dataclass(frozen=True, slots=True)
class EveryTicks:
    """Ticks every ``every`` seconds from ``anchor`` (itself the first tick), exact to the
    microsecond: tick *k* is ``anchor + k × every``, so intervals never drift."""

    anchor: datetime
    every: float

    @property
    def _step(self) -> int:
        return max(1, round(self.every * 1_000_000))

    def _at(self, index: int) -> datetime:
        return self.anchor + timedelta(microseconds=index * self._step)

    def _elapsed(self, moment: datetime) -> int:
        delta = moment - self.anchor
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        if moment < self.anchor:
            return None
        return self._at(self._elapsed(moment) // self._step)

    def next_after(self, moment: datetime) -> datetime:
        if moment < self.anchor:
            return self.anchor
        return self._at(self._elapsed(moment) // self._step + 1)


@dataclass(frozen=True, slots=True)
class TickPlan:
    """The outcome of planning one due schedule."""

    ticks: list[datetime]
    """Ticks to publish now, oldest first (possibly none)."""
    next_run_at: datetime
    """The first tick after the latest due one."""
    dropped: int
    """Due ticks not published (missed, under the schedule's policy); at least this many."""


def plan_ticks(
    source: TickSource,
    *,
    next_run_at: datetime,
    now: datetime,
    missed: Missed,
    grace: float,
) -> TickPlan:
    """Decide which due ticks to publish at ``now`` and when the schedule runs next.

    ``next_run_at`` is the schedule's first unpublished tick. Every tick from it up to
    ``now`` is due; the most recent due tick is *on time* when it is at most ``grace``
    seconds old, and every other due tick is *missed*. A schedule that is not due yet
    gets an empty plan with its ``next_run_at`` unchanged.
    """
    if next_run_at > now:
        return TickPlan(ticks=[], next_run_at=next_run_at, dropped=0)
    latest = source.latest_at_or_before(now)
    if latest is None or latest < next_run_at:
        # The stored next run is off the source's grid (clock moved back, or a DST quirk):
        # publish it as the one due tick rather than lose it.
        latest = next_run_at
    following = source.next_after(latest)
    if missed is Missed.ALL:
        ticks = [latest]
        while len(ticks) < MAX_MISSED_TICKS:
            earlier = source.latest_at_or_before(ticks[-1] - _MICROSECOND)
            if earlier is None or earlier < next_run_at:
                break
            ticks.append(earlier)
        ticks.reverse()
        dropped = 0 if ticks[0] == next_run_at else 1
        return TickPlan(ticks=ticks, next_run_at=following, dropped=dropped)
    older = 0 if latest == next_run_at else 1
    if missed is Missed.LATEST or (now - latest).total_seconds() <= grace:
        return TickPlan(ticks=[latest], next_run_at=following, dropped=older)
    return TickPlan(ticks=[], next_run_at=following, dropped=older + 1)


def tick_text(tick: datetime) -> str:
    """A tick as it appears in headers and idempotency keys: ISO 8601 in UTC."""
    return tick.astimezone(UTC).isoformat()
