"""SQLite schedule operations, mixed into :class:`SqliteBackend`.

A write transaction here is ``BEGIN IMMEDIATE``: one writer at a time, so the
compare-and-set of :meth:`schedule_fire_many` and the tick's publish commit together or
not at all, and a second scheduler sees the advanced next run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlbroker.core.message import NewMessage
from sqlbroker.storage.base import InsertResult
from sqlbroker.storage.columns import utc
from sqlbroker.storage.schedules import (
    DueSchedules,
    ScheduleDefinition,
    ScheduleFire,
    ScheduleRecord,
    definition_params,
    due_records,
    schedule_record_of,
)
from sqlbroker.storage.sql import load_blocks
from sqlbroker.storage.sqlite.connection import SqlitePool

_SQL = load_blocks("sqlbroker.storage.sqlite", "schedules.sql")


def _seconds(moment: datetime) -> float:
    return moment.timestamp()


class SqliteSchedules:
    """Schedule operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool

    def _now(self) -> float:
        raise NotImplementedError

    def message_insert_many(
        self,
        *,
        messages: Sequence[NewMessage],
        subscription: str | None,
        conn: Any = None,
    ) -> InsertResult:
        raise NotImplementedError

    def schedule_upsert(self, *, definition: ScheduleDefinition) -> ScheduleRecord:
        params = {**definition_params(definition, times=_seconds), "now": self._now()}
        with self._db.write() as conn:
            conn.execute(_SQL["schedule_upsert"], params)
            row = conn.execute(_SQL["schedule_get"], {"name": definition.name}).fetchone()
        return schedule_record_of(row)

    def schedule_list(self, *, names: Sequence[str] | None) -> list[ScheduleRecord]:
        encoded = None if names is None else json.dumps(list(names))
        with self._db.read() as conn:
            rows = conn.execute(_SQL["schedule_list"], {"names": encoded}).fetchall()
        return [schedule_record_of(row) for row in rows]

    def schedule_delete(self, *, name: str) -> bool:
        with self._db.write() as conn:
            return conn.execute(_SQL["schedule_delete"], {"name": name}).rowcount > 0

    def schedule_set_paused(self, *, name: str, paused: bool, next_run_at: datetime | None) -> bool:
        with self._db.write() as conn:
            if paused:
                conn.execute(_SQL["schedule_pause"], {"name": name, "now": self._now()})
            else:
                assert next_run_at is not None
                conn.execute(
                    _SQL["schedule_resume"],
                    {"name": name, "next_run_at": next_run_at.timestamp(), "now": self._now()},
                )
            return bool(conn.execute(_SQL["schedule_exists"], {"name": name}).fetchone()[0])

    def schedule_due(self, *, limit: int) -> DueSchedules:
        now = self._now()
        with self._db.read() as conn:
            rows = conn.execute(_SQL["schedule_due"], {"now": now, "limit": limit}).fetchall()
            earliest = conn.execute(_SQL["schedule_next_run"], {"now": now}).fetchone()[0]
        return DueSchedules(
            now=utc(now),
            due=due_records(rows),
            next_run_at=None if earliest is None else utc(earliest),
        )

    def schedule_fire_many(self, *, fires: Sequence[ScheduleFire]) -> dict[str, list[str]]:
        if not fires:
            return {}
        fired: dict[str, list[str]] = {}
        with self._db.write() as conn:
            won: list[ScheduleFire] = []
            for fire in fires:
                advanced = conn.execute(
                    _SQL["schedule_advance"],
                    {
                        "name": fire.name,
                        "next_run_at": fire.next_run_at.timestamp(),
                        "last_run_at": None
                        if fire.last_run_at is None
                        else fire.last_run_at.timestamp(),
                        "last_message_id": fire.messages[-1].message_id if fire.messages else None,
                        "expected_next_run_at": fire.expected_next_run_at.timestamp(),
                        "definition_hash": fire.definition_hash,
                    },
                ).rowcount
                if advanced == 1:
                    won.append(fire)
            messages = [message for fire in won for message in fire.messages]
            ids = (
                self.message_insert_many(messages=messages, subscription=None, conn=conn)
                if messages
                else InsertResult(message_ids=[], duplicates=0, unrouted=0)
            ).message_ids
            position = 0
            for fire in won:
                published = ids[position : position + len(fire.messages)]
                position += len(fire.messages)
                if published and published[-1] != fire.messages[-1].message_id:
                    # The tick's idempotency key was taken already: point at that message.
                    conn.execute(
                        _SQL["schedule_last_message"],
                        {"name": fire.name, "last_message_id": published[-1]},
                    )
                fired[fire.name] = published
        return fired
