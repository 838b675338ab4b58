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
from typing import Any

from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.features.schedules import ScheduleRun
from sqlbroker.runtime.writeback import wait_any

log = logging.getLogger("sqlbroker.runtime")

MIN_WAIT = 0.005
"""The shortest pause between passes: a tick due "now" is not polled for in a busy loop."""


class Scheduler:
    """Runs ``run_due`` (one scheduler pass, blocking) until stopped."""

    def __init__(self, run_due: Callable[[], ScheduleRun], *, poll_interval: float) -> None:
        self._run_due = run_due
        self._poll = poll_interval

    def _pass(self) -> float:
        """One pass; how long to wait before the next."""
        try:
            run = self._run_due()
        except SqlbrokerError as error:
            log.warning("scheduler pass failed: %s", error)
            return self._poll
        if run.published:
            log.debug(
                "scheduler published %s",
                {name: len(ids) for name, ids in run.published.items()},
                extra={"schedules": sorted(run.published)},
            )
        wake_in = run.wake_in
        return self._poll if wake_in is None else min(self._poll, max(MIN_WAIT, wake_in))

    async def run(self, stop: asyncio.Event, run_blocking: Callable[..., Awaitable[Any]]) -> None:
        """The worker's side task: passes on the worker's database threads until ``stop``."""
        while not stop.is_set():
            wait: float = await run_blocking(self._pass)
            await wait_any(stop, timeout=wait)

    def run_forever(self, stop: threading.Event) -> None:
        """Blocking passes until ``stop`` is set (a process that only schedules)."""
        while not stop.is_set():
            stop.wait(self._pass())
