"""Time sources.

Leases, delays, TTLs and dedupe windows are computed by the database from its own clock,
so hosts with skewed clocks agree (DESIGN §2.9). A :class:`Clock` can override that for
tests: storage passes ``clock.now()`` into every statement, and a ``None`` there means
"use the database's clock".
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlbroker.core.validate import point_in_time


class Clock(Protocol):
    """What ``Broker(clock=...)`` accepts: anything with a ``now()`` method."""

    def now(self) -> datetime | None:
        """The time to use, or ``None`` for the database's own clock."""


class DatabaseClock:
    """The production clock: the database decides what time it is."""

    def now(self) -> datetime | None:
        """Always ``None``: every statement uses the database's clock."""
        return None

    def __repr__(self) -> str:
        return "DatabaseClock()"


class ManualClock:
    """A clock that moves only when told to; for tests of leases, delays and TTLs.

    ``start`` must be timezone-aware (``InvalidTime`` otherwise): a naive time would mean
    local time to one database and UTC to another."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = datetime.now(UTC) if start is None else point_in_time(start, "start")
        self._lock = threading.Lock()

    def now(self) -> datetime | None:
        """The clock's current time (moved only by :meth:`advance`)."""
        with self._lock:
            return self._now

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move the clock forward by ``seconds`` (or a ``timedelta``); returns the new time."""
        step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        with self._lock:
            self._now += step
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now.isoformat()})"
