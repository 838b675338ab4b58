"""Metrics from recorded facts: the per-minute counters workers write with their heartbeats
summed and turned into rates and handler-time quantiles, the workers still alive, and the
shapes of those readings. The readings themselves — ``broker.stats()``,
``metrics_series()``, ``unrouted()`` — are plans of :mod:`sqlbroker.client.inspection`,
which the CLI, Prometheus and the dashboard read through, so that every face agrees."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlbroker.core import validate
from sqlbroker.core.observability import (
    MinuteCounts,
    SeriesPoint,
    WorkerInfo,
    merge_buckets,
    quantile,
)

RATE_WINDOW = 300.0
"""Seconds over which ``stats()`` averages rates and estimates handler-time quantiles."""

MAX_SERIES_MINUTES = 24 * 60


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
