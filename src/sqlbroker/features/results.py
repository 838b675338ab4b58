"""Stored results: ``broker.result(message_id, wait=…, subscription=…)``.

A lookup reads every trace of the message (``Backend.result_lookup``) and
:func:`~sqlbroker.core.results.read_result` decides the copy's result. A waiting lookup
sleeps on the backend's result watch (storage/result_hub.py: one per backend, however many
wait) — PostgreSQL: LISTEN for the NOTIFY a stored value or a dead letter sends in its
commit; SQLite: the ``PRAGMA data_version`` watcher — and looks again on each hint (at most
every :data:`MIN_LOOK_GAP` seconds). Hints can be lost, and a copy that
completes without a value (or expires, or is cancelled) sends none on PostgreSQL: a bounded
fallback look every :data:`FALLBACK_POLL` seconds covers those. The watch is entered
before the look that follows it, so a hint sent in between is not missed.

A copy still pending gives ``None`` (not finished within ``wait``); an unknown message
raises ``NotFound``; a message with copies in several subscriptions needs
``subscription=`` (``InvalidOption`` names them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlbroker.core import validate
from sqlbroker.core.errors import NotFound
from sqlbroker.core.results import (
    Result,
    ResultRecord,
    read_result,
    result_subscription,
    vanished_result,
)
from sqlbroker.core.topics import validate_topic
from sqlbroker.storage.backend import Backend

T = TypeVar("T")
DEFAULT_RESULT_TTL = 24 * 3600.0
"""How long a stored value is kept by default (the ``result_ttl`` broker option)."""
MAX_WAIT = validate.MAX_LEASE
FALLBACK_POLL = 1.0
"""Seconds between two looks of a waiting lookup when no hint came."""
MIN_LOOK_GAP = 0.01
"""Seconds at least between two looks of one waiting lookup: on SQLite every commit is a
hint to every waiter, and a busy database commits every few milliseconds."""


def check_result_ttl(value: object) -> float:
    return validate.seconds(value, "result_ttl", allow_zero=False)


def check_arguments(
    message_id: object, wait: object, subscription: object
) -> tuple[str, float, str | None]:
    """Validate ``result()``'s arguments (the same on both faces and the CLI)."""
    checked_id = validate.message_id(message_id)
    seconds = validate.seconds(wait, "wait", maximum=MAX_WAIT)
    name = None if subscription is None else validate_topic(subscription, "subscription")
    return checked_id, seconds, name


class _Look:
    """The state of one waiting lookup: the copy it has seen pending, if any."""

    def __init__(self, message_id: str, subscription: str | None, ttl: float) -> None:
        self.message_id = message_id
        self.subscription = subscription
        self.ttl = ttl
        self.seen: str | None = None

    def read(self, records: list[ResultRecord], now: Callable[[], datetime]) -> Result | None:
        try:
            name = result_subscription(self.message_id, records, self.subscription or self.seen)
        except NotFound:
            if self.seen is None:
                raise
            # Seen pending, now gone without a trace: completed without a value, with
            # archive_completed=False.
            return vanished_result(self.message_id, self.seen, now())
        found = read_result(
            self.message_id,
            records,
            name,
            values_kept_since=lambda: now() - timedelta(seconds=self.ttl),
        )
        if found is None:
            self.seen = name
        return found


class Results:
    """Result lookups of one broker; ``fallback_polls`` counts the sleeps of waiting
    lookups that ended without a hint — for the fallback look, or at the end of the wait
    (for tests and diagnosis)."""

    def __init__(self, backend: Callable[[], Backend], *, ttl: float) -> None:
        self._backend = backend
        self._ttl = ttl
        self.fallback_polls = 0

    def get(
        self,
        message_id: str,
        *,
        wait: float | timedelta = 0.0,
        subscription: str | None = None,
    ) -> Result | None:
        checked_id, seconds, name = check_arguments(message_id, wait, subscription)
        backend = self._backend()
        look = _Look(checked_id, name, self._ttl)
        found = look.read(backend.result_lookup(message_id=checked_id), backend.now)
        if found is not None or seconds == 0:
            return found
        deadline = time.monotonic() + seconds
        with backend.result_watch(message_id=checked_id) as watch:
            while True:
                looked = time.monotonic()
                found = look.read(backend.result_lookup(message_id=checked_id), backend.now)
                remaining = deadline - time.monotonic()
                if found is not None or remaining <= 0:
                    return found
                if not watch.wait(min(remaining, FALLBACK_POLL)):
                    self.fallback_polls += 1
                time.sleep(max(0.0, min(looked + MIN_LOOK_GAP, deadline) - time.monotonic()))

    async def get_async(
        self,
        message_id: str,
        *,
        wait: float | timedelta = 0.0,
        subscription: str | None = None,
        run: Callable[..., Awaitable[Any]],
    ) -> Result | None:
        """:meth:`get` for coroutines: lookups run through ``run`` (the async broker's
        database threads), the wait on the loop."""
        checked_id, seconds, name = check_arguments(message_id, wait, subscription)
        backend: Backend = await run(self._backend)
        look = _Look(checked_id, name, self._ttl)

        async def read() -> Result | None:
            result: Result | None = await run(
                lambda: look.read(backend.result_lookup(message_id=checked_id), backend.now)
            )
            return result

        found = await read()
        if found is not None or seconds == 0:
            return found
        deadline = time.monotonic() + seconds
        async with backend.result_watch_async(message_id=checked_id) as watch:
            while True:
                looked = time.monotonic()
                found = await read()
                remaining = deadline - time.monotonic()
                if found is not None or remaining <= 0:
                    return found
                if not await watch.wait(min(remaining, FALLBACK_POLL)):
                    self.fallback_polls += 1
                await asyncio.sleep(
                    max(0.0, min(looked + MIN_LOOK_GAP, deadline) - time.monotonic())
                )
