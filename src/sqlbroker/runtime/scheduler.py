"""The scheduler: publishes the due ticks of durable schedules, in a loop.

Every worker runs one as a side task (``schedules=False`` turns it off), and
``sqlbroker scheduler`` runs one on its own. Any number may run against one database:
each tick is published once (see :mod:`sqlbroker.features.schedules`), so there is no
leader to elect and nothing to fail over. A pass sleeps until the earliest next run, but
never longer than the poll interval, so schedules defined elsewhere are picked up soon.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable

from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.features.schedules import ScheduleRun
from sqlbroker.runtime.writeback import wait_any

log = logging.getLogger("sqlbroker.runtime")

MIN_WAIT = 0.005
"""The shortest pause between passes: a tick due "now" is not polled for in a busy loop."""


class Scheduler:
    """Runs scheduler passes (``run_due``) until stopped."""

    def __init__(self, *, poll_interval: float) -> None:
        self._poll = poll_interval

    def _wait(self, run: ScheduleRun | SqlbrokerError) -> float:
        """How long to wait after a pass (or its failure) before the next."""
        if isinstance(run, SqlbrokerError):
            log.warning("scheduler pass failed: %s", run)
            return self._poll
        if run.published:
            log.debug(
                "scheduler published %s",
                {name: len(ids) for name, ids in run.published.items()},
                extra={"schedules": sorted(run.published)},
            )
        wake_in = run.wake_in
        return self._poll if wake_in is None else min(self._poll, max(MIN_WAIT, wake_in))

    async def run(self, stop: asyncio.Event, run_due: Callable[[], Awaitable[ScheduleRun]]) -> None:
        """The worker's side task: passes on the worker's loop until ``stop``."""
        while not stop.is_set():
            try:
                run: ScheduleRun | SqlbrokerError = await run_due()
            except SqlbrokerError as error:
                run = error
            await wait_any(stop, timeout=self._wait(run))

    def run_forever(self, stop: threading.Event, run_due: Callable[[], ScheduleRun]) -> None:
        """Blocking passes until ``stop`` is set (a process that only schedules)."""
        while not stop.is_set():
            try:
                run: ScheduleRun | SqlbrokerError = run_due()
            except SqlbrokerError as error:
                run = error
            stop.wait(self._wait(run))
