"""Metrics from recorded facts: queue gauges joined with the per-minute counters workers
write with their heartbeats, and the rare outcomes (expired, unrouted) counted in the
archive. Every face — ``broker.stats()``, the CLI, Prometheus and the dashboard — reads
through here, so they agree."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlbroker.core import validate
from sqlbroker.core.message import SubscriptionStats
from sqlbroker.core.observability import (
    MinuteCounts,
    SeriesPoint,
    WorkerInfo,
    merge_buckets,
    quantile,
)
from sqlbroker.storage.backend import Backend

RATE_WINDOW = 300.0
"""Seconds over which ``stats()`` averages rates and estimates handler-time quantiles."""

MAX_SERIES_MINUTES = 24 * 60


@dataclass(frozen=True, slots=True)
class Unrouted:
    """Publishes that matched no subscription, still in the archive: in all and recently."""

    total: int
    recent: int


def _minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def subscription_stats(
    backend: Backend, *, window: float | timedelta = RATE_WINDOW
) -> list[SubscriptionStats]:
    """Gauges per subscription plus rates and handler times over the last ``window`` seconds
    (to the minute: over the minutes the window overlaps)."""
    seconds = validate.seconds(window, "window", allow_zero=False, maximum=24 * 3600.0)
    gauges = backend.stats_collect()
    now = backend.now()
    since = now - timedelta(seconds=seconds)
    # A counter row covers a whole minute: take every minute that overlaps the window, and
    # divide by the time those rows cover — from the start of the first to now (the current
    # minute's row holds what happened so far) — which is up to a minute more than the window.
    first_minute = _minute_floor(since)
    rows = backend.metric_minutes(since=first_minute)
    expired = {
        rare.subscription: rare.total
        for rare in backend.archive_rare_counts(since=since)
        if rare.outcome == "expired"
    }
    per_minute = 60.0 / max((now - first_minute).total_seconds(), seconds)
    grouped: dict[str, list[MinuteCounts]] = defaultdict(list)
    for row in rows:
        grouped[row.subscription].append(row)
    result = []
    for gauge in gauges:
        mine = grouped.get(gauge.subscription, [])
        buckets = merge_buckets(row.handler_buckets for row in mine)
        result.append(
            dataclasses.replace(
                gauge,
                completed_per_minute=sum(r.completed for r in mine) * per_minute,
                retried_per_minute=sum(r.retried for r in mine) * per_minute,
                dead_per_minute=sum(r.dead for r in mine) * per_minute,
                handler_p50=quantile(buckets, 0.5),
                handler_p95=quantile(buckets, 0.95),
                expired=expired.get(gauge.subscription, 0),
            )
        )
    return result


def _points(rows: Iterable[MinuteCounts], minutes: list[datetime]) -> list[SeriesPoint]:
    by_minute: dict[datetime, list[MinuteCounts]] = defaultdict(list)
    for row in rows:
        by_minute[row.minute].append(row)
    points = []
    for minute in minutes:
        mine = by_minute.get(minute, [])
        buckets = merge_buckets(row.handler_buckets for row in mine)
        points.append(
            SeriesPoint(
                minute=minute,
                completed=sum(r.completed for r in mine),
                retried=sum(r.retried for r in mine),
                dead=sum(r.dead for r in mine),
                handler_p50=quantile(buckets, 0.5),
                handler_p95=quantile(buckets, 0.95),
            )
        )
    return points


def series(backend: Backend, *, minutes: int = 60) -> dict[str, list[SeriesPoint]]:
    """Per subscription, one point per minute for the last ``minutes`` minutes (the current,
    partial minute last), zeros where nothing was recorded."""
    count = validate.integer(minutes, "minutes", minimum=1, maximum=MAX_SERIES_MINUTES)
    current = _minute_floor(backend.now())
    axis = [current - timedelta(minutes=back) for back in range(count - 1, -1, -1)]
    grouped: dict[str, list[MinuteCounts]] = defaultdict(list)
    for row in backend.metric_minutes(since=axis[0]):
        grouped[row.subscription].append(row)
    names = {s.name for s in backend.subscription_list()} | set(grouped)
    return {name: _points(grouped.get(name, []), axis) for name in sorted(names)}


def unrouted(backend: Backend, *, window: float | timedelta = RATE_WINDOW) -> Unrouted:
    """Unrouted publishes in the archive: in all, and within the last ``window`` seconds."""
    seconds = validate.seconds(window, "window", allow_zero=False, maximum=24 * 3600.0)
    since = backend.now() - timedelta(seconds=seconds)
    found = [r for r in backend.archive_rare_counts(since=since) if r.outcome == "unrouted"]
    return Unrouted(total=sum(r.total for r in found), recent=sum(r.recent for r in found))


def workers(backend: Backend) -> list[WorkerInfo]:
    """Every worker row, most recently seen first (stopped ones included)."""
    return backend.worker_list()


def alive(found: Iterable[WorkerInfo], *, max_age: float) -> list[WorkerInfo]:
    """The workers not stopped whose last heartbeat is at most ``max_age`` seconds old."""
    return [w for w in found if w.stopped_at is None and w.seen_age <= max_age]
