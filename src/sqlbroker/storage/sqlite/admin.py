"""SQLite administration: listings, dead-letter admin, the archive and stats.

Kept apart from the hot-path queue operations in :mod:`backend`, whose class mixes this in."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from sqlbroker.core.message import (
    ArchivedMessage,
    DeadLetter,
    Outcome,
    PendingMessage,
    State,
    SubscriptionStats,
    error_type_matches,
)
from sqlbroker.core.serde import encode_json
from sqlbroker.storage.base import DeadFilter
from sqlbroker.storage.rows import archived_of, dead_letter_of, pending_of
from sqlbroker.storage.sqlite.connection import SqlitePool


def _error_type_params(name: str | None) -> dict[str, Any]:
    exact, suffix = error_type_matches(name) if name is not None else ([], "")
    return {"error_types": json.dumps(exact), "error_suffix": suffix}


class SqliteAdmin:
    """Administrative operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool
    _sql: dict[str, str]

    def _now(self) -> float:
        raise NotImplementedError

    # --- listings ----------------------------------------------------------------------------

    def message_list(
        self, *, subscription: str | None, state: State | None, limit: int
    ) -> list[PendingMessage]:
        with self._db.read() as conn:
            rows = conn.execute(
                self._sql["message_list"],
                {
                    "subscription": subscription,
                    "state": state.value if state else None,
                    "limit": limit,
                    "now": self._now(),
                },
            ).fetchall()
        return [pending_of(row) for row in rows]

    # --- dead letters ------------------------------------------------------------------------

    @staticmethod
    def _dead_params(where: DeadFilter) -> dict[str, Any]:
        return {
            "ids": None if where.ids is None else json.dumps(list(where.ids)),
            "subscription": where.subscription,
            "topic": where.topic,
            "error_type": where.error_type,
            **_error_type_params(where.error_type),
            "reason_contains": where.reason_contains,
            "dead_before": None if where.dead_before is None else where.dead_before.timestamp(),
            "dead_after": None if where.dead_after is None else where.dead_after.timestamp(),
        }

    def dead_list(self, *, where: DeadFilter, limit: int, after_id: int | None) -> list[DeadLetter]:
        with self._db.read() as conn:
            rows = conn.execute(
                self._sql["dead_select"],
                {**self._dead_params(where), "after_id": after_id, "limit": limit},
            ).fetchall()
        return [dead_letter_of(row) for row in rows]

    def dead_get(self, *, id: int) -> DeadLetter | None:
        found = self.dead_list(where=DeadFilter(ids=(id,)), limit=1, after_id=None)
        return found[0] if found else None

    def _dead_ids(self, conn: sqlite3.Connection, where: DeadFilter) -> list[int]:
        rows = conn.execute(
            self._sql["dead_select"], {**self._dead_params(where), "after_id": None, "limit": -1}
        ).fetchall()
        return [row["id"] for row in rows]

    def _audit(
        self, conn: sqlite3.Connection, actor: str, action: str, detail: dict[str, Any]
    ) -> None:
        conn.execute(
            self._sql["audit_insert"],
            {"now": self._now(), "actor": actor, "action": action, "detail": encode_json(detail)},
        )

    def dead_replay(self, *, where: DeadFilter, actor: str, note: str | None) -> list[int]:
        now = self._now()
        with self._db.write() as conn:
            ids = self._dead_ids(conn, where)
            if not ids:
                return []
            encoded = json.dumps(ids)
            subscriptions = json.dumps(
                sorted(
                    {
                        row["subscription"]
                        for row in conn.execute(self._sql["dead_subscriptions"], {"ids": encoded})
                    }
                )
            )
            conn.execute(
                self._sql["subscription_ensure_many"], {"names": subscriptions, "now": now}
            )
            new_ids = [
                row[0]
                for row in conn.execute(
                    self._sql["dead_replay_insert"], {"ids": encoded, "now": now}
                )
            ]
            conn.execute(self._sql["dead_delete_ids"], {"ids": encoded})
            self._audit(
                conn, actor, "dead.replay", {"dead_ids": ids, "delivery_ids": new_ids, "note": note}
            )
        return sorted(new_ids)

    def dead_purge(self, *, where: DeadFilter, actor: str, note: str | None) -> int:
        with self._db.write() as conn:
            ids = self._dead_ids(conn, where)
            if ids:
                conn.execute(self._sql["dead_delete_ids"], {"ids": json.dumps(ids)})
                self._audit(conn, actor, "dead.purge", {"dead_ids": ids, "note": note})
        return len(ids)

    # --- archive and stats -------------------------------------------------------------------

    def archive_list(
        self,
        *,
        subscription: str | None,
        outcome: Outcome | None,
        message_id: str | None,
        limit: int,
    ) -> list[ArchivedMessage]:
        with self._db.read() as conn:
            rows = conn.execute(
                self._sql["archive_list"],
                {
                    "subscription": subscription,
                    "outcome": outcome.value if outcome else None,
                    "message_id": message_id,
                    "limit": limit,
                },
            ).fetchall()
        return [archived_of(row) for row in rows]

    def stats_collect(self) -> list[SubscriptionStats]:
        now = self._now()
        with self._db.read() as conn:
            names = [row[0] for row in conn.execute(self._sql["stats_subscriptions"])]
            hot = conn.execute(self._sql["stats_hot"], {"now": now}).fetchall()
            dead = {row[0]: row[1] for row in conn.execute(self._sql["stats_dead"])}
        # Like PostgreSQL's: every subscription, and any name that still has copies or dead
        # letters (a deleted subscription's dead letters stay).
        counts: dict[str, dict[str, int]] = {name: {} for name in [*names, *dead]}
        oldest: dict[str, float] = {}
        for subscription, state, count, oldest_available in hot:
            counts.setdefault(subscription, {})[state] = count
            if oldest_available is not None:
                oldest[subscription] = oldest_available
        return [
            SubscriptionStats(
                subscription=name,
                ready=by_state.get("available", 0),
                scheduled=by_state.get("scheduled", 0),
                running=by_state.get("running", 0),
                blocked=by_state.get("blocked", 0),
                dead=dead.get(name, 0),
                oldest_ready_age=max(0.0, now - oldest[name]) if name in oldest else None,
            )
            for name, by_state in sorted(counts.items())
        ]

    def table_counts(self) -> dict[str, int]:
        with self._db.read() as conn:
            return {row[0]: row[1] for row in conn.execute(self._sql["table_counts"])}
