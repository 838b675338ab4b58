"""PostgreSQL observability operations: heartbeats, per-minute counters and the audit trail.

Mixed into :class:`~sqlbroker.storage.postgres.backend.PostgresBackend`; the SQL lives in
``observability.sql``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

from psycopg.rows import dict_row

from sqlbroker.core.observability import (
    AuditEntry,
    MinuteCounts,
    RareCount,
    WorkerBeat,
    WorkerInfo,
)
from sqlbroker.storage.columns import utc
from sqlbroker.storage.postgres.connection import PostgresPool
from sqlbroker.storage.rows import audit_of, minute_of, rare_count_of, totals_of, worker_of
from sqlbroker.storage.sql import load_blocks


class PostgresObservability:
    """Heartbeats, metrics and audit reads of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _qualifier: str

    def _now_param(self) -> datetime | None:
        raise NotImplementedError

    @cached_property
    def _obs_sql(self) -> dict[str, str]:
        return load_blocks(
            "sqlbroker.storage.postgres", "observability.sql", schema=self._qualifier
        )

    def _obs_select(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self._db.connection(write=False) as conn:
            return conn.cursor(row_factory=dict_row).execute(self._obs_sql[name], params).fetchall()

    def worker_beat(
        self,
        *,
        beat: WorkerBeat,
        minutes: Sequence[MinuteCounts],
        totals: Mapping[tuple[str, str], int],
    ) -> datetime:
        sql = self._obs_sql
        with self._db.transaction() as conn:
            row = conn.execute(
                sql["worker_upsert"],
                {
                    "name": beat.name,
                    "host": beat.host,
                    "pid": beat.pid,
                    "subscriptions": json.dumps(list(beat.subscriptions)),
                    "now": self._now_param(),
                    "stopping": beat.stopping,
                    "starting": beat.starting,
                },
            ).fetchone()
            assert row is not None
            cursor = conn.cursor()
            if minutes:
                cursor.executemany(
                    sql["metric_minute_upsert"],
                    [
                        {
                            "subscription": m.subscription,
                            "minute": m.minute,
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
            deltas = [
                {"subscription": subscription, "outcome": outcome, "delta": delta}
                for (subscription, outcome), delta in sorted(totals.items())
                if delta
            ]
            if deltas:
                cursor.executemany(sql["metric_total_add"], deltas)
        return utc(row[0])

    def worker_list(self) -> list[WorkerInfo]:
        rows = self._obs_select("worker_list", {"now": self._now_param()})
        return [worker_of(row) for row in rows]

    def metric_minutes(self, *, since: datetime) -> list[MinuteCounts]:
        rows = self._obs_select("metric_minutes", {"since": since})
        return [minute for minute in map(minute_of, rows) if minute is not None]

    def metric_totals(self) -> dict[tuple[str, str], int]:
        rows = self._obs_select("metric_totals", {})
        return totals_of(rows)

    def archive_rare_counts(self, *, since: datetime) -> list[RareCount]:
        rows = self._obs_select("archive_rare_counts", {"since": since})
        return [rare_count_of(row) for row in rows]

    def metric_trim(self, *, older_than: datetime, limit: int) -> int:
        sql = self._obs_sql
        with self._db.transaction() as conn:
            minutes = conn.execute(
                sql["metric_minute_trim"], {"older_than": older_than, "limit": limit}
            ).rowcount
            workers = conn.execute(sql["worker_trim"], {"older_than": older_than}).rowcount
        return max(0, minutes) + max(0, workers)

    def audit_list(self, *, limit: int, before_id: int | None) -> list[AuditEntry]:
        rows = self._obs_select("audit_list", {"limit": limit, "before_id": before_id})
        return [audit_of(row) for row in rows]
