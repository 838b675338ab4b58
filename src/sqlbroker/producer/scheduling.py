"""The schedules of both faces: define, list, pause and run them. The work is done by
:class:`~sqlbroker.features.schedules.Schedules` (blocking: on a thread for the awaiting
face); these are the typed plans (see :mod:`sqlbroker.features.faces`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlbroker.core.message import NORMAL
from sqlbroker.core.schedules import DEFAULT_GRACE, Missed, Schedule
from sqlbroker.features.faces import Plan, blocking
from sqlbroker.features.schedules import ScheduleRun

if TYPE_CHECKING:
    from sqlbroker.producer.base import BrokerBase


def schedule(
    broker: BrokerBase,
    name: str,
    topic: str,
    payload: Any,
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str = "UTC",
    missed: Missed | str = Missed.LATEST,
    grace: float | timedelta = DEFAULT_GRACE,
    start_at: datetime | None = None,
    headers: Mapping[str, str] | None = None,
    priority: int = NORMAL,
    key: str | None = None,
    ttl: float | timedelta | None = None,
    max_attempts: int | None = None,
    content_type: str | None = None,
) -> Plan[Schedule]:
    """Publish ``payload`` to ``topic`` on a schedule: ``cron="0 3 * * *"`` (croniter,
    in the time zone ``tz``) or ``every=`` seconds or a timedelta. Durable: workers
    (or :meth:`run_due_schedules`) publish each tick exactly once, however many run.

    Upserts by ``name``: the same definition again changes nothing; the same timing
    with other options keeps the next run; a new timing recomputes it. ``start_at``:
    no tick before it (an interval's ticks count from it; without it the first is one
    interval from now). ``missed``: what to do with ticks that passed while nothing
    ran — ``"latest"`` (publish the most recent one), ``"skip"`` (none; a tick at most
    ``grace`` seconds late is on time, not missed) or ``"all"`` (each of them, at most
    1000 at once). Each tick's message carries the headers ``sqlbroker-schedule``
    (the name) and ``sqlbroker-tick`` (the tick's time, ISO 8601 in UTC), and the
    idempotency key ``schedule:<name>:<tick>``. The other options are as in
    :meth:`publish`. Everything is validated before anything is written.
    """
    defined: Schedule = yield blocking(
        broker._schedules.define,
        name,
        topic,
        payload,
        cron=cron,
        every=every,
        tz=tz,
        missed=missed,
        grace=grace,
        start_at=start_at,
        headers=headers,
        priority=priority,
        key=key,
        ttl=ttl,
        max_attempts=max_attempts,
        content_type=content_type,
    )
    return defined


def unschedule(broker: BrokerBase, name: str) -> Plan[bool]:
    """Delete a schedule; return whether it existed. Messages it published stay."""
    deleted: bool = yield blocking(broker._schedules.delete, name)
    return deleted


def schedules(broker: BrokerBase, names: Iterable[str] | None = None) -> Plan[list[Schedule]]:
    """Every schedule (or the named ones), by name, with its next and last run."""
    # Read here, not on the awaiting face's thread: a generator may not be thread-safe.
    # Anything else goes as it is, for Schedules to refuse (a str is not a list of names).
    plain = isinstance(names, str | bytes | Mapping) or not isinstance(names, Iterable)
    chosen = names if plain else list(names)  # type: ignore[arg-type]
    found: list[Schedule] = yield blocking(broker._schedules.list, chosen)
    return found


def pause_schedule(broker: BrokerBase, name: str) -> Plan[bool]:
    """Publish no ticks of ``name`` until :meth:`resume_schedule`; return whether it
    exists."""
    paused: bool = yield blocking(broker._schedules.pause, name)
    return paused


def resume_schedule(broker: BrokerBase, name: str) -> Plan[bool]:
    """Resume a paused schedule from its first tick after now (ticks that fell while it
    was paused are not published); return whether it exists."""
    resumed: bool = yield blocking(broker._schedules.resume, name)
    return resumed


def run_due_schedules(broker: BrokerBase) -> Plan[ScheduleRun]:
    """One scheduler pass: publish every due tick and advance the schedules. Workers
    run this on their own; call it from scripts, cron jobs or tests."""
    run: ScheduleRun = yield blocking(broker._schedules.run_due)
    return run
