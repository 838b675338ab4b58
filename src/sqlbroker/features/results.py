"""Stored results: ``broker.result(message_id, wait=…, subscription=…)``, one plan for both
faces (:meth:`Results.lookup`; see :mod:`sqlbroker.features.faces`).

A lookup reads every trace of the message (``result_lookup``) and
:func:`~sqlbroker.core.results.read_result` decides the copy's result. A waiting lookup
sleeps on a waiter of the backend's result hub (storage/result_hub.py: one source per
backend, however many wait) — PostgreSQL: LISTEN for the NOTIFY a stored value or a dead
letter sends in its commit; SQLite: the ``PRAGMA data_version`` watcher — and looks again
on each hint (at most every :data:`MIN_LOOK_GAP` seconds). The blocking face sleeps on the
waiter's thread event and ``time.sleep``; the awaiting face on the loop (an
``asyncio.Event`` the source sets, ``asyncio.sleep``), its looks on the backend's coroutine
operations: no thread of its own. Hints can be lost, and a copy that
completes without a value (or expires, or is cancelled) sends none on PostgreSQL: a bounded
fallback look every :data:`FALLBACK_POLL` seconds covers those. The watch is entered
before the look that follows it, so a hint sent in between is not missed.

A copy still pending gives ``None`` (not finished within ``wait``); an unknown message
raises ``NotFound``; a message with copies in several subscriptions needs
``subscription=`` (``InvalidOption`` names them).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlbroker.core import validate
from sqlbroker.core.errors import NotFound
from sqlbroker.core.results import (
    Result,
    ResultRecord,
    read_result,
    result_subscription,
)
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.faces import Call, Plan, call
from sqlbroker.storage.result_hub import ResultHub, Waiter

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


class _NeedNow(Exception):
    """Raised by :meth:`_Look.read` given no ``now`` when it needs one."""


class _Look:
    """The state of one waiting lookup: the copy it has seen pending, if any."""

    def __init__(self, message_id: str, subscription: str | None, ttl: float) -> None:
        self.message_id = message_id
        self.subscription = subscription
        self.ttl = ttl
        self.seen: str | None = None

    def read(self, records: Sequence[ResultRecord], now: datetime | None) -> Result | None:
        """The result in ``records``; raises :class:`_NeedNow` when it depends on the
        time and ``now`` is ``None`` (most lookups do not: they save a statement)."""

        def clock() -> datetime:
            if now is None:
                raise _NeedNow
            return now

        try:
            name = result_subscription(self.message_id, records, self.subscription or self.seen)
        except NotFound:
            if self.seen is None:
                raise
            # Seen pending, now gone without a trace: only a completion without a value
            # under archive_completed=False does that; finished when it was noticed.
            return Result(self.message_id, self.seen, "completed", None, None, None, clock())
        found = read_result(
            self.message_id,
            records,
            name,
            values_kept_since=lambda: clock() - timedelta(seconds=self.ttl),
        )
        if found is None:
            self.seen = name
        return found

    def plan(self) -> Plan[Result | None]:
        """One look: the message's traces (and the storage clock, when needed)."""
        records: list[ResultRecord] = yield call("result_lookup", message_id=self.message_id)
        try:
            return self.read(records, None)
        except _NeedNow:
            return self.read(records, (yield call("clock_now")))


def _hinted(waiter: Waiter, timeout: float) -> Call:
    return Call(
        "result_wait",
        blocking=functools.partial(waiter.wait, timeout),
        awaiting=functools.partial(waiter.wait_async, timeout),
    )


def _pause(seconds: float) -> Call:
    return Call(
        "result_pause",
        blocking=functools.partial(time.sleep, seconds),
        awaiting=functools.partial(asyncio.sleep, seconds),
    )


class Results:
    """Result lookups of one broker; ``fallback_polls`` counts the sleeps of waiting
    lookups that ended without a hint — for the fallback look, or at the end of the wait
    (for tests and diagnosis)."""

    def __init__(self, *, ttl: float) -> None:
        self._ttl = ttl
        self.fallback_polls = 0

    def lookup(
        self,
        hub: ResultHub,
        message_id: str,
        *,
        wait: float | timedelta = 0.0,
        subscription: str | None = None,
    ) -> Plan[Result | None]:
        """``broker.result`` as a plan, hints from ``hub``: see the module's docstring."""
        checked_id = validate.message_id(message_id)
        seconds = validate.seconds(wait, "wait", maximum=MAX_WAIT)
        name = None if subscription is None else validate_topic(subscription, "subscription")
        look = _Look(checked_id, name, self._ttl)
        found = yield from look.plan()
        if found is not None or seconds == 0:
            return found
        deadline = time.monotonic() + seconds
        # The waiter is registered before the look that follows it, so that a hint sent in
        # between is not missed.
        waiter = hub.register(checked_id)
        try:
            yield Call("result_ready", blocking=waiter.ready, awaiting=waiter.ready_async)
            while True:
                looked = time.monotonic()
                found = yield from look.plan()
                remaining = deadline - time.monotonic()
                if found is not None or remaining <= 0:
                    return found
                if not (yield _hinted(waiter, min(remaining, FALLBACK_POLL))):
                    self.fallback_polls += 1
                yield _pause(max(0.0, min(looked + MIN_LOOK_GAP, deadline) - time.monotonic()))
        finally:
            hub.unregister(checked_id, waiter)
