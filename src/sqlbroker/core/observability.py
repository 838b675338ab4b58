"""Observability facts: worker heartbeats, per-minute counters, handler-time histograms and
the audit trail, as plain rows, plus the pure arithmetic on them that makes metrics: the
per-minute counters workers write with their heartbeats merged and summed into rates,
handler-time quantiles and series, and the workers still alive. The readings themselves —
``broker.stats()``, ``metrics_series()``, ``unrouted()`` — are plans of
:mod:`sqlbroker.client.inspection`, which the CLI, Prometheus and the dashboard read
through, so that every face agrees."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlbroker.core import validate

HANDLER_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    math.inf,
)
"""Upper bounds (seconds, inclusive) of the handler-time histogram's buckets."""
RATE_WINDOW = 300.0
"""Seconds over which ``stats()`` averages rates and estimates handler-time quantiles."""
MAX_SERIES_MINUTES = 24 * 60


def bucket_index(seconds: float) -> int:
    """The index of the histogram bucket that holds a duration of ``seconds`` (the first
    bound at or above it; the last bucket for anything else)."""
    return min(bisect.bisect_left(HANDLER_BUCKETS, seconds), len(HANDLER_BUCKETS) - 1)


def merge_buckets(histograms: Iterable[Sequence[int]]) -> list[int]:
    """Add histograms bucket by bucket (shorter ones count as zeros where they end)."""
    total = [0] * len(HANDLER_BUCKETS)
    for histogram in histograms:
        for index, count in enumerate(histogram[: len(total)]):
            total[index] += int(count)
    return total


def quantile(buckets: Sequence[int], q: float) -> float | None:
    """Estimate the ``q`` quantile (0..1) of a histogram by linear interpolation inside the
    bucket that holds it, as Prometheus' ``histogram_quantile`` does; ``None`` when empty.
    A quantile in the open last bucket is reported as that bucket's lower bound."""
    count = sum(buckets)
    if count == 0:
        return None
    rank = q * count
    seen = 0
    for index, in_bucket in enumerate(buckets):
        if in_bucket and seen + in_bucket >= rank:
            lower = 0.0 if index == 0 else HANDLER_BUCKETS[index - 1]
            upper = HANDLER_BUCKETS[index]
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * max(0.0, rank - seen) / in_bucket
        seen += in_bucket
    return HANDLER_BUCKETS[-2]


@dataclass(slots=True)
class MinuteCounts:
    """What one worker did for one subscription during one minute (``minute`` is its start)."""

    subscription: str
    minute: datetime
    worker: str
    completed: int = 0
    retried: int = 0
    dead: int = 0
    handler_count: int = 0
    handler_seconds: float = 0.0
    handler_buckets: list[int] = field(default_factory=lambda: [0] * len(HANDLER_BUCKETS))


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """A worker saying it is alive: ``starting`` on its first beat (which resets
    ``started_at``), ``stopping`` on its last after a clean stop."""

    name: str
    host: str
    pid: int
    subscriptions: tuple[str, ...]
    starting: bool = False
    stopping: bool = False


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker as last seen; ``seen_age`` is seconds since its last heartbeat."""

    name: str
    host: str
    pid: int
    subscriptions: tuple[str, ...]
    started_at: datetime
    seen_at: datetime
    stopped_at: datetime | None
    seen_age: float
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns (stand-in values fill them);
    ``None`` for a sound row. See docs/security.md, "Damaged rows"."""


@dataclass(frozen=True, slots=True)
class RareCount:
    """Archived copies of a rare outcome (``expired`` or ``unrouted``); ``subscription`` is
    ``None`` for unrouted publishes."""

    subscription: str | None
    outcome: str
    total: int
    recent: int


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """Who did what to dead letters, when and why (``detail`` holds ids and the note)."""

    id: int
    at: datetime
    actor: str
    action: str
    detail: dict[str, object]
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns (stand-in values fill them);
    ``None`` for a sound row. See docs/security.md, "Damaged rows"."""


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One minute of one subscription, summed over workers."""

    minute: datetime
    completed: int
    retried: int
    dead: int
    handler_p50: float | None
    handler_p95: float | None


@dataclass(frozen=True, slots=True)
class Unrouted:
    """Publishes that matched no subscription, still in the archive: in all and recently."""

    total: int
    recent: int


def minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def window_seconds(window: object) -> float:
    """A window of recent time (``stats()``, ``unrouted()``): up to a day."""
    return validate.seconds(window, "window", allow_zero=False, maximum=24 * 3600.0)


def grouped(rows: Iterable[MinuteCounts], by: str) -> dict[Any, list[MinuteCounts]]:
    """``rows`` by the value of their field ``by``, in order."""
    found: dict[Any, list[MinuteCounts]] = defaultdict(list)
    for row in rows:
        found[getattr(row, by)].append(row)
    return found


def summary(rows: Sequence[MinuteCounts]) -> tuple[int, int, int, float | None, float | None]:
    """Completed, retried and dead in ``rows``, and their handler time p50 and p95."""
    buckets = merge_buckets(row.handler_buckets for row in rows)
    return (
        sum(r.completed for r in rows),
        sum(r.retried for r in rows),
        sum(r.dead for r in rows),
        quantile(buckets, 0.5),
        quantile(buckets, 0.95),
    )


def points(rows: Iterable[MinuteCounts], minutes: list[datetime]) -> list[SeriesPoint]:
    """One point for each of ``minutes``, summed over ``rows`` (zeros where none)."""
    by_minute = grouped(rows, "minute")
    return [SeriesPoint(minute, *summary(by_minute.get(minute, []))) for minute in minutes]


def alive(found: Iterable[WorkerInfo], *, max_age: float) -> list[WorkerInfo]:
    """The workers not stopped whose last heartbeat is at most ``max_age`` seconds old."""
    return [w for w in found if w.stopped_at is None and w.seen_age <= max_age]
