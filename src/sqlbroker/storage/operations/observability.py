"""Observability: worker heartbeats, per-minute counters, lifetime totals and the audit
trail (see :mod:`sqlbroker.core.observability` and :mod:`sqlbroker.runtime.heartbeat`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from sqlbroker.core.observability import (
    AuditEntry,
    MinuteCounts,
    RareCount,
    WorkerBeat,
    WorkerInfo,
)
from sqlbroker.storage.columns import utc
from sqlbroker.storage.plan import Plan, named, query, reads
from sqlbroker.storage.rows import audit_of, minute_of, rare_count_of, totals_of, worker_of

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


def worker_beat(
    settings: Settings,
    *,
    beat: WorkerBeat,
    minutes: Sequence[MinuteCounts],
    totals: Mapping[tuple[str, str], int],
) -> Plan[datetime]:
    """Record the worker as seen now (and stopped, with ``beat.stopping``), write its
    per-minute counters (absolute values: a row is owned by one worker, so writing it again
    is harmless) and add ``totals``, deltas keyed by ``(subscription, outcome)``, to the
    lifetime counters. Return the storage clock's now.

    Three statements, the only one that must not repeat last: should the beat fail
    before the deltas are added (outside a transaction, on PostgreSQL), writing it again
    counts nothing twice."""
    seen = yield query(
        "worker_upsert",
        name=beat.name,
        host=beat.host,
        pid=beat.pid,
        subscriptions=json.dumps(list(beat.subscriptions)),
        stopping=beat.stopping,
        starting=beat.starting,
    )
    if minutes:
        yield query(
            "metric_minute_upsert_many",
            subscriptions=[m.subscription for m in minutes],
            minutes=[m.minute for m in minutes],
            workers=[m.worker for m in minutes],
            completed=[m.completed for m in minutes],
            retried=[m.retried for m in minutes],
            dead=[m.dead for m in minutes],
            handler_counts=[m.handler_count for m in minutes],
            handler_seconds=[float(m.handler_seconds) for m in minutes],
            handler_buckets=[json.dumps(m.handler_buckets) for m in minutes],
        )
    # One order of rows for every worker, so that two never wait on each other.
    deltas = [(key, delta) for key, delta in sorted(totals.items()) if delta]
    if deltas:
        yield query(
            "metric_total_add_many",
            subscriptions=[subscription for (subscription, _), _ in deltas],
            outcomes=[outcome for (_, outcome), _ in deltas],
            deltas=[delta for _, delta in deltas],
        )
    return utc(seen[0][0])


@reads
def worker_list(settings: Settings) -> Plan[list[WorkerInfo]]:
    """Every worker row, most recently seen first."""
    rows = yield named("worker_list")
    return [worker_of(row) for row in rows]


@reads
def metric_minutes(settings: Settings, *, since: datetime) -> Plan[list[MinuteCounts]]:
    """Per-minute counters of every worker for minutes starting at or after ``since``."""
    rows = yield named("metric_minutes", since=since)
    return [minute for minute in map(minute_of, rows) if minute is not None]


@reads
def metric_totals(settings: Settings) -> Plan[dict[tuple[str, str], int]]:
    """Lifetime outcome counters keyed by ``(subscription, outcome)``."""
    rows = yield named("metric_totals")
    return totals_of(rows)


@reads
def archive_rare_counts(settings: Settings, *, since: datetime) -> Plan[list[RareCount]]:
    """Expired and unrouted copies still in the archive: in all and since ``since``."""
    rows = yield named("archive_rare_counts", since=since)
    return [rare_count_of(row) for row in rows]


def metric_trim(settings: Settings, *, older_than: datetime, limit: int) -> Plan[int]:
    """Delete minute counters and worker rows last seen before ``older_than``."""
    minutes = yield query("metric_minute_trim", older_than=older_than, limit=limit)
    workers = yield query("worker_trim", older_than=older_than)
    return max(0, minutes.rowcount) + max(0, workers.rowcount)


@reads
def audit_list(settings: Settings, *, limit: int, before_id: int | None) -> Plan[list[AuditEntry]]:
    """Audit entries, newest first; page with ``before_id``."""
    rows = yield named("audit_list", limit=limit, before_id=before_id)
    return [audit_of(row) for row in rows]


@reads
def clock_now(settings: Settings) -> Plan[datetime]:
    """The storage clock's now (the database's, or the test clock's): what a caller
    measures windows of the recorded facts from."""
    rows = yield query("now")
    return utc(rows[0][0])
