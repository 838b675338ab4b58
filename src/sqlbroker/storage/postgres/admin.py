"""PostgreSQL administration: listings, dead-letter admin, the archive and stats.

Kept apart from the hot-path queue operations in :mod:`backend`, whose class mixes this in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from sqlbroker.core.message import (
    ArchivedMessage,
    DeadLetter,
    Outcome,
    PendingMessage,
    State,
    SubscriptionStats,
    error_type_matches,
)
from sqlbroker.storage.base import DeadFilter
from sqlbroker.storage.postgres.connection import PostgresPool
from sqlbroker.storage.rows import archived_of, dead_letter_of, pending_of


def _error_type_params(name: str | None) -> dict[str, Any]:
    exact, suffix = error_type_matches(name) if name is not None else ([], "")
    return {"error_types": exact, "error_suffix": suffix}


class PostgresAdmin:
    """Administrative operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _sql: dict[str, str]
    notify_channel: str

    def _now_param(self) -> datetime | None:
        raise NotImplementedError

    def _select(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run the read-only block ``name``; rows come back as dicts for the row mappers."""
        with self._db.connection(write=False) as conn:
            return conn.cursor(row_factory=dict_row).execute(self._sql[name], params).fetchall()

    # --- listings ----------------------------------------------------------------------------

    def message_list(
        self, *, subscription: str | None, state: State | None, limit: int
    ) -> list[PendingMessage]:
        rows = self._select(
            "message_list",
            {
                "subscription": subscription,
                "state": state.value if state else None,
                "limit": limit,
                "now": self._now_param(),
            },
        )
        return [pending_of(row) for row in rows]

    # --- dead letters ------------------------------------------------------------------------

    @staticmethod
    def _dead_params(where: DeadFilter) -> dict[str, Any]:
        return {
            "ids": None if where.ids is None else list(where.ids),
            "subscription": where.subscription,
            "topic": where.topic,
            "error_type": where.error_type,
            **_error_type_params(where.error_type),
            "reason_contains": where.reason_contains,
            "dead_before": where.dead_before,
            "dead_after": where.dead_after,
        }

    def dead_list(self, *, where: DeadFilter, limit: int, after_id: int | None) -> list[DeadLetter]:
        rows = self._select(
            "dead_select",
            {**self._dead_params(where), "after_id": after_id, "limit": limit},
        )
        return [dead_letter_of(row) for row in rows]

    def dead_get(self, *, id: int) -> DeadLetter | None:
        found = self.dead_list(where=DeadFilter(ids=(id,)), limit=1, after_id=None)
        return found[0] if found else None

    def dead_replay(self, *, where: DeadFilter, actor: str, note: str | None) -> list[int]:
        params = {
            **self._dead_params(where),
            "now": self._now_param(),
            "actor": actor,
            "note": note,
            "channel": self.notify_channel,
        }
        with self._db.transaction() as conn:
            # Replayed copies join their key's line like new publishes: take the key locks.
            keys = sorted(row[0] for row in conn.execute(self._sql["dead_replay_keys"], params))
            if keys:
                conn.execute(self._sql["key_lock"], {"keys": keys})
            return [row[0] for row in conn.execute(self._sql["dead_replay"], params).fetchall()]

    def dead_purge(self, *, where: DeadFilter, actor: str, note: str | None) -> int:
        params = {
            **self._dead_params(where),
            "now": self._now_param(),
            "actor": actor,
            "note": note,
        }
        with self._db.connection(write=True) as conn:
            row = conn.execute(self._sql["dead_purge"], params).fetchone()
        return int(row[0]) if row else 0

    # --- archive and stats -------------------------------------------------------------------

    def archive_list(
        self,
        *,
        subscription: str | None,
        outcome: Outcome | None,
        message_id: str | None,
        limit: int,
    ) -> list[ArchivedMessage]:
        rows = self._select(
            "archive_list",
            {
                "subscription": subscription,
                "outcome": outcome.value if outcome else None,
                "message_id": message_id,
                "limit": limit,
            },
        )
        return [archived_of(row) for row in rows]

    def stats_collect(self) -> list[SubscriptionStats]:
        with self._db.connection(write=False) as conn:
            rows = conn.execute(self._sql["stats"], {"now": self._now_param()}).fetchall()
        return [
            SubscriptionStats(
                subscription=r[0],
                ready=r[1],
                scheduled=r[2],
                running=r[3],
                blocked=r[4],
                dead=r[5],
                oldest_ready_age=r[6],
            )
            for r in rows
        ]

    def table_counts(self) -> dict[str, int]:
        with self._db.connection(write=False) as conn:
            return {
                row[0]: int(row[1]) for row in conn.execute(self._sql["table_counts"]).fetchall()
            }
