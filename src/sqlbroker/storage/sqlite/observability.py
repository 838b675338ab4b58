"""SQLite observability operations: heartbeats, per-minute counters and the audit trail.

Mixed into :class:`~sqlbroker.storage.sqlite.backend.SqliteBackend`; the SQL lives in
``observability.sql``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlbroker.core.observability import (
    AuditEntry,
    MinuteCounts,
    RareCount,
    WorkerBeat,
    WorkerInfo,
)
from sqlbroker.storage.columns import utc
from sqlbroker.storage.rows import audit_of, minute_of, rare_count_of, totals_of, worker_of
from sqlbroker.storage.sql import load_blocks
from sqlbroker.storage.sqlite.connection import SqlitePool

_SQL = load_blocks("sqlbroker.storage.sqlite", "observability.sql")


class SqliteObservability:
    """Heartbeats, metrics and audit reads of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool

    def _now(self) -> float:
        raise NotImplementedError

    def worker_beat(
        self,
        *,
        beat: WorkerBeat,
        minutes: Sequence[MinuteCounts],
        totals: Mapping[tuple[str, str], int],
    ) -> datetime:
        now = self._now()
        with self._db.write() as conn:
            conn.execute(
                _SQL["worker_upsert"],
                {
                    "name": beat.name,
                    "host": beat.host,
                    "pid": beat.pid,
                    "subscriptions": json.dumps(list(beat.subscriptions)),
                    "now": now,
                    "stopping": beat.stopping,
                    "starting": beat.starting,
                },
            )
            conn.executemany(
                _SQL["metric_minute_upsert"],
                [
                    {
                        "subscription": m.subscription,
                        "minute": m.minute.timestamp(),
                        "worker": m.worker,
                        "completed": m.completed,
                        "retried": m.retried,
                        "dead": m.dead,
                        "handler_count": m.handler_count,
                        "handler_seconds": m.handler_seconds,
                        "handler_buckets": json.dumps(m.handler_buckets),
                    }
                    for m in minutes
                ],
            )
            conn.executemany(
                _SQL["metric_total_add"],
                [
                    {"subscription": subscription, "outcome": outcome, "delta": delta}
                    for (subscription, outcome), delta in sorted(totals.items())
                    if delta
                ],
            )
        return utc(now)

    def worker_list(self) -> list[WorkerInfo]:
        with self._db.read() as conn:
            rows = conn.execute(_SQL["worker_list"], {"now": self._now()}).fetchall()
        return [worker_of(row) for row in rows]

    def metric_minutes(self, *, since: datetime) -> list[MinuteCounts]:
        with self._db.read() as conn:
            rows = conn.execute(_SQL["metric_minutes"], {"since": since.timestamp()}).fetchall()
        return [minute for minute in map(minute_of, rows) if minute is not None]

    def metric_totals(self) -> dict[tuple[str, str], int]:
        with self._db.read() as conn:
            rows = conn.execute(_SQL["metric_totals"]).fetchall()
        return totals_of(rows)

    def archive_rare_counts(self, *, since: datetime) -> list[RareCount]:
        with self._db.read() as conn:
            rows = conn.execute(
                _SQL["archive_rare_counts"], {"since": since.timestamp()}
            ).fetchall()
        return [rare_count_of(row) for row in rows]

    def metric_trim(self, *, older_than: datetime, limit: int) -> int:
        cutoff = older_than.timestamp()
        with self._db.write() as conn:
            minutes = conn.execute(
                _SQL["metric_minute_trim"], {"older_than": cutoff, "limit": limit}
            ).rowcount
            workers = conn.execute(_SQL["worker_trim"], {"older_than": cutoff}).rowcount
        return minutes + workers

    def audit_list(self, *, limit: int, before_id: int | None) -> list[AuditEntry]:
        with self._db.read() as conn:
            rows = conn.execute(
                _SQL["audit_list"], {"limit": limit, "before_id": before_id}
            ).fetchall()
        return [audit_of(row) for row in rows]
