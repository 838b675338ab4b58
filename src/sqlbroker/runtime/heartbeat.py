"""The worker's heartbeat: it says the worker is alive and writes what the worker did.

A :class:`MetricsRecorder` observes the worker's events and keeps, per subscription and
minute, the outcomes written back and a histogram of handler times. The heartbeat task
(:func:`run_heartbeat`) writes them with the worker's row in one transaction every
``interval`` seconds — one small write, never on the hot path — and a last time after the
final write-back on a clean stop. A failed beat keeps everything for the next one. Rows
older than a day are trimmed now and then.

Minutes follow the database clock: each beat returns the storage clock's time, and local
time is shifted by the difference, so workers on skewed hosts fill the same minutes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.message import Delivery
from sqlbroker.core.observability import HANDLER_BUCKETS, MinuteCounts, WorkerBeat, bucket_index
from sqlbroker.core.settlements import Settlement
from sqlbroker.runtime.events import WorkerObserver
from sqlbroker.runtime.writeback import wait_any
from sqlbroker.storage.backend import Backend

log = logging.getLogger("sqlbroker.runtime")

DEFAULT_HEARTBEAT = 5.0
DEFAULT_RETENTION = 24 * 3600.0
TRIM_INTERVAL = 600.0
TRIM_LIMIT = 10_000

MinuteKey = tuple[str, datetime]
_COUNTERS = {"complete": "completed", "retry": "retried", "dead": "dead"}
"""The counter of :class:`MinuteCounts` (and of the totals) each settlement kind adds to."""
_FASTEST = HANDLER_BUCKETS[0]


class MetricsRecorder(WorkerObserver):
    """Per-minute counters of one worker, waiting for the next heartbeat to write them."""

    def __init__(self, worker: str, *, wall: Callable[[], float] = time.time) -> None:
        self._worker = worker
        self._wall = wall
        self._offset = 0.0
        self._minutes: dict[MinuteKey, MinuteCounts] = {}
        self._dirty: set[MinuteKey] = set()
        self._totals: Counter[tuple[str, str]] = Counter()
        self._minute_number = -1
        self._minute = datetime.fromtimestamp(0, UTC)

    def synced(self, storage_now: datetime) -> None:
        """Align minutes with the storage clock, as read at a heartbeat."""
        self._offset = storage_now.timestamp() - self._wall()

    def _row(self, subscription: str) -> MinuteCounts:
        # Called per handler and per outcome: the minute's datetime is built once a minute.
        minute = int((self._wall() + self._offset) // 60)
        if minute != self._minute_number:
            self._minute_number = minute
            self._minute = datetime.fromtimestamp(minute * 60, UTC)
        key = (subscription, self._minute)
        row = self._minutes.get(key)
        if row is None:
            row = self._minutes[key] = MinuteCounts(
                subscription=subscription, minute=key[1], worker=self._worker
            )
        self._dirty.add(key)
        return row

    def handler_finished(
        self, delivery: Delivery, *, seconds: float, error: BaseException | None
    ) -> None:
        row = self._row(delivery.subscription)
        row.handler_count += 1
        row.handler_seconds += seconds
        # Most handlers of a busy worker end within the first bound: the bisect of
        # bucket_index costs ~2.8k instructions, this comparison next to nothing.
        row.handler_buckets[0 if seconds <= _FASTEST else bucket_index(seconds)] += 1

    def outcomes_written(self, outcomes: Sequence[Settlement]) -> None:
        subscription, row = "", None  # a write's outcomes come mostly from one subscription
        for outcome in outcomes:
            delivery = outcome.delivery
            if delivery is None:  # not the worker's: the runtime settles deliveries
                continue
            if row is None or delivery.subscription != subscription:
                subscription = delivery.subscription
                row = self._row(subscription)
            counter = _COUNTERS.get(outcome.kind)
            if counter is not None:
                setattr(row, counter, getattr(row, counter) + 1)
                self._totals[(subscription, counter)] += 1

    def take(self) -> tuple[list[MinuteCounts], dict[tuple[str, str], int]]:
        """Copies of the rows changed since the last take, and the totals not yet written.
        Pass them back to :meth:`written` or :meth:`failed`."""
        minutes = self._minutes
        rows = [
            replace(minutes[key], handler_buckets=list(minutes[key].handler_buckets))
            for key in sorted(self._dirty)
        ]
        self._dirty.clear()
        return rows, dict(self._totals)

    def written(self, totals: dict[tuple[str, str], int]) -> None:
        """The last take was committed: its totals are no longer pending, and minutes
        before the previous one will not change again."""
        self._totals.subtract(totals)
        self._totals = +self._totals
        horizon = datetime.fromtimestamp(self._wall() + self._offset, UTC) - timedelta(minutes=2)
        for key in [k for k in self._minutes if k[1] < horizon and k not in self._dirty]:
            del self._minutes[key]

    def failed(self, rows: Sequence[MinuteCounts]) -> None:
        """The last take was not committed: write those rows again next time."""
        self._dirty.update((row.subscription, row.minute) for row in rows)


async def run_heartbeat(
    backend: Backend,
    recorder: MetricsRecorder,
    beat: WorkerBeat,
    stop: asyncio.Event,
    *,
    interval: float = DEFAULT_HEARTBEAT,
) -> None:
    """Beat every ``interval`` seconds until ``stop`` is set, then once more as ``stopping``.
    Each beat writes ``recorder``'s pending counters with the worker's row; a failed one
    keeps them for the next. Old rows are trimmed after a beat, at most once per
    ``TRIM_INTERVAL``."""
    started = False
    trimmed: float | None = None  # time.monotonic() of the last trim
    while True:
        stopping = stop.is_set()
        rows, totals = recorder.take()
        sent = replace(beat, starting=not started, stopping=stopping)
        try:
            now = await backend.async_ops.worker_beat(beat=sent, minutes=rows, totals=totals)
        except SqlbrokerError as error:
            recorder.failed(rows)
            log.warning("heartbeat of %s failed: %s", beat.name, error)
        else:
            assert isinstance(now, datetime)
            started = True
            recorder.synced(now)
            recorder.written(totals)
            if trimmed is None or time.monotonic() - trimmed >= TRIM_INTERVAL:
                trimmed = time.monotonic()
                await _trim(backend, now)
        if stopping:
            return
        await wait_any(stop, timeout=interval)


async def _trim(backend: Backend, now: datetime) -> None:
    try:
        await backend.async_ops.metric_trim(
            older_than=now - timedelta(seconds=DEFAULT_RETENTION),
            limit=TRIM_LIMIT,
        )
    except SqlbrokerError as error:
        log.warning("trimming old metrics failed: %s", error)
