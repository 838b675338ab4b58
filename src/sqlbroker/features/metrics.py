"""Metrics from recorded facts: queue gauges joined with the per-minute counters workers
write with their heartbeats, the rare outcomes (expired, unrouted) counted in the
archive, and the replaced publishes counted in the lifetime totals. Every face —
``broker.stats()``, the CLI, Prometheus and the dashboard — reads through here, so they
agree. Each reading is a plan (:mod:`sqlbroker.features.faces`), run by either face."""

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
    RareCount,
    SeriesPoint,
    WorkerInfo,
    merge_buckets,
    quantile,
)
from sqlbroker.features.faces import Plan, call

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


def subscription_stats(*, window: float | timedelta = RATE_WINDOW) -> Plan[list[SubscriptionStats]]:
    """Gauges per subscription plus rates and handler times over the last ``window`` seconds
    (to the minute: over the minutes the window overlaps)."""
    seconds = validate.seconds(window, "window", allow_zero=False, maximum=24 * 3600.0)
    gauges: list[SubscriptionStats] = yield call("stats_collect")
    now: datetime = yield call("clock_now")
    since = now - timedelta(seconds=seconds)
    # A counter row covers a whole minute: take every minute that overlaps the window, and
    # divide by the time those rows cover — from the start of the first to now (the current
    # minute's row holds what happened so far) — which is up to a minute more than the window.
    first_minute = _minute_floor(since)
    rows: list[MinuteCounts] = yield call("metric_minutes", since=first_minute)
    rare: list[RareCount] = yield call("archive_rare_counts", since=since)
    expired = {r.subscription: r.total for r in rare if r.outcome == "expired"}
    totals: dict[tuple[str, str], int] = yield call("metric_totals")
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
                replaced=totals.get((gauge.subscription, "replaced"), 0),
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


def series(*, minutes: int = 60) -> Plan[dict[str, list[SeriesPoint]]]:
    """Per subscription, one point per minute for the last ``minutes`` minutes (the current,
    partial minute last), zeros where nothing was recorded."""
    count = validate.integer(minutes, "minutes", minimum=1, maximum=MAX_SERIES_MINUTES)
    current = _minute_floor((yield call("clock_now")))
    axis = [current - timedelta(minutes=back) for back in range(count - 1, -1, -1)]
    grouped: dict[str, list[MinuteCounts]] = defaultdict(list)
    for row in (yield call("metric_minutes", since=axis[0])):
        grouped[row.subscription].append(row)
    names = {s.name for s in (yield call("subscription_list"))} | set(grouped)
    return {name: _points(grouped.get(name, []), axis) for name in sorted(names)}


def unrouted(*, window: float | timedelta = RATE_WINDOW) -> Plan[Unrouted]:
    """Unrouted publishes in the archive: in all, and within the last ``window`` seconds."""
    seconds = validate.seconds(window, "window", allow_zero=False, maximum=24 * 3600.0)
    since = (yield call("clock_now")) - timedelta(seconds=seconds)
    rare: list[RareCount] = yield call("archive_rare_counts", since=since)
    found = [r for r in rare if r.outcome == "unrouted"]
    return Unrouted(total=sum(r.total for r in found), recent=sum(r.recent for r in found))


def alive(found: Iterable[WorkerInfo], *, max_age: float) -> list[WorkerInfo]:
    """The workers not stopped whose last heartbeat is at most ``max_age`` seconds old."""
    return [w for w in found if w.stopped_at is None and w.seen_age <= max_age]
