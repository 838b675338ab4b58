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
from sqlbroker.storage.rows import utc, utc_or_none
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
        return [
            WorkerInfo(
                name=row["name"],
                host=row["host"],
                pid=row["pid"],
                subscriptions=tuple(json.loads(row["subscriptions"])),
                started_at=utc(row["started_at"]),
                seen_at=utc(row["seen_at"]),
                stopped_at=utc_or_none(row["stopped_at"]),
                seen_age=float(row["seen_age"]),
            )
            for row in rows
        ]

    def metric_minutes(self, *, since: datetime) -> list[MinuteCounts]:
        with self._db.read() as conn:
            rows = conn.execute(_SQL["metric_minutes"], {"since": since.timestamp()}).fetchall()
        return [
            MinuteCounts(
                subscription=row["subscription"],
                minute=utc(row["minute"]),
                worker=row["worker"],
                completed=row["completed"],
                retried=row["retried"],
                dead=row["dead"],
                handler_count=row["handler_count"],
                handler_seconds=row["handler_seconds"],
                handler_buckets=[int(n) for n in json.loads(row["handler_buckets"])],
            )
            for row in rows
        ]

    def metric_totals(self) -> dict[tuple[str, str], int]:
        with self._db.read() as conn:
            rows = conn.execute(_SQL["metric_totals"]).fetchall()
        return {(row["subscription"], row["outcome"]): int(row["count"]) for row in rows}

    def archive_rare_counts(self, *, since: datetime) -> list[RareCount]:
        with self._db.read() as conn:
            rows = conn.execute(
                _SQL["archive_rare_counts"], {"since": since.timestamp()}
            ).fetchall()
        return [
            RareCount(
                subscription=row["subscription"],
                outcome=row["outcome"],
                total=int(row["total"]),
                recent=int(row["recent"]),
            )
            for row in rows
        ]

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
        return [
            AuditEntry(
                id=row["id"],
                at=utc(row["at"]),
                actor=row["actor"],
                action=row["action"],
                detail=dict(json.loads(row["detail"])),
            )
            for row in rows
        ]
