"""PostgreSQL schedule operations, mixed into :class:`PostgresBackend`.

:meth:`schedule_fire_many` runs its compare-and-set and the tick's publish in one
transaction: a scheduler that loses the race for a row waits on its lock, then finds the
next run moved on and publishes nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from sqlbroker.core.message import NewMessage
from sqlbroker.storage.base import InsertResult
from sqlbroker.storage.columns import utc
from sqlbroker.storage.postgres.connection import PostgresPool
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


def _as_is(moment: datetime) -> datetime:
    return moment


class PostgresSchedules:
    """Schedule operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _qualifier: str

    def _now_param(self) -> datetime | None:
        raise NotImplementedError

    def message_insert_many(
        self, *, messages: Sequence[NewMessage], subscription: str | None, conn: Any = None
    ) -> InsertResult:
        raise NotImplementedError

    @functools.cached_property
    def _schedule_sql(self) -> dict[str, str]:
        return load_blocks("sqlbroker.storage.postgres", "schedules.sql", schema=self._qualifier)

    def schedule_upsert(self, *, definition: ScheduleDefinition) -> ScheduleRecord:
        sql = self._schedule_sql
        params = {**definition_params(definition, times=_as_is), "now": self._now_param()}
        with self._db.connection(write=True) as conn:
            conn.execute(sql["schedule_upsert"], params)
            row = (
                conn.cursor(row_factory=dict_row)
                .execute(sql["schedule_get"], {"name": definition.name})
                .fetchone()
            )
        assert row is not None
        return schedule_record_of(row)

    def schedule_list(self, *, names: Sequence[str] | None) -> list[ScheduleRecord]:
        with self._db.connection(write=False) as conn:
            rows = (
                conn.cursor(row_factory=dict_row)
                .execute(
                    self._schedule_sql["schedule_list"],
                    {"names": None if names is None else list(names)},
                )
                .fetchall()
            )
        return [schedule_record_of(row) for row in rows]

    def schedule_delete(self, *, name: str) -> bool:
        with self._db.connection(write=True) as conn:
            cursor = conn.execute(self._schedule_sql["schedule_delete"], {"name": name})
            return cursor.rowcount > 0

    def schedule_set_paused(self, *, name: str, paused: bool, next_run_at: datetime | None) -> bool:
        sql = self._schedule_sql
        params = {"name": name, "now": self._now_param(), "next_run_at": next_run_at}
        with self._db.connection(write=True) as conn:
            if paused:
                conn.execute(sql["schedule_pause"], params)
            else:
                assert next_run_at is not None
                conn.execute(sql["schedule_resume"], params)
            row = conn.execute(sql["schedule_exists"], params).fetchone()
        return bool(row and row[0])

    def schedule_due(self, *, limit: int) -> DueSchedules:
        sql = self._schedule_sql
        with self._db.connection(write=False) as conn:
            rows = (
                conn.cursor(row_factory=dict_row)
                .execute(sql["schedule_due"], {"now": self._now_param(), "limit": limit})
                .fetchall()
            )
            now = rows[0]["clock_now"]
            earliest = conn.execute(sql["schedule_next_run"], {"now": now}).fetchone()
        return DueSchedules(
            now=utc(now),
            due=due_records([row for row in rows if row["name"] is not None]),
            next_run_at=None if earliest is None or earliest[0] is None else utc(earliest[0]),
        )

    def schedule_fire_many(self, *, fires: Sequence[ScheduleFire]) -> dict[str, list[str]]:
        if not fires:
            return {}
        sql = self._schedule_sql
        fired: dict[str, list[str]] = {}
        with self._db.transaction() as conn:
            won: list[ScheduleFire] = []
            # One lock order for every scheduler: by name, so that two batches never wait
            # on each other's rows.
            for fire in sorted(fires, key=lambda fire: fire.name):
                advanced = conn.execute(
                    sql["schedule_advance"],
                    {
                        "name": fire.name,
                        "next_run_at": fire.next_run_at,
                        "last_run_at": fire.last_run_at,
                        "last_message_id": fire.messages[-1].message_id if fire.messages else None,
                        "expected_next_run_at": fire.expected_next_run_at,
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
                        sql["schedule_last_message"],
                        {"name": fire.name, "last_message_id": published[-1]},
                    )
                fired[fire.name] = published
        return fired
