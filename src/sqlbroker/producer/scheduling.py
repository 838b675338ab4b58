"""The schedules of :class:`~sqlbroker.Broker`: define, list, pause and run them. The work
is done by :class:`~sqlbroker.features.schedules.Schedules`; this is the typed facade."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlbroker.core.message import NORMAL
from sqlbroker.core.schedules import DEFAULT_GRACE, Missed, Schedule
from sqlbroker.features.schedules import ScheduleRun, Schedules


class BrokerSchedules:
    """Schedule operations of :class:`~sqlbroker.Broker` (mixed into it)."""

    _schedules: Schedules

    def schedule(
        self,
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
    ) -> Schedule:
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
        return self._schedules.define(
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

    def unschedule(self, name: str) -> bool:
        """Delete a schedule; return whether it existed. Messages it published stay."""
        return self._schedules.delete(name)

    def schedules(self, names: Iterable[str] | None = None) -> list[Schedule]:
        """Every schedule (or the named ones), by name, with its next and last run."""
        return self._schedules.list(names)

    def pause_schedule(self, name: str) -> bool:
        """Publish no ticks of ``name`` until :meth:`resume_schedule`; return whether it
        exists."""
        return self._schedules.pause(name)

    def resume_schedule(self, name: str) -> bool:
        """Resume a paused schedule from its first tick after now (ticks that fell while it
        was paused are not published); return whether it exists."""
        return self._schedules.resume(name)

    def run_due_schedules(self) -> ScheduleRun:
        """One scheduler pass: publish every due tick and advance the schedules. Workers
        run this on their own; call it from scripts, cron jobs or tests."""
        return self._schedules.run_due()
