"""Running plans on psycopg 3, sync and async: the PostgreSQL dialect.

Parameters go to psycopg as they are (sequences become arrays, times ``timestamptz``);
``now`` is the test clock's reading or ``NULL``, which the SQL replaces with the
database's own clock. Rows come back as tuples, or as dictionaries for a ``named`` query.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import TupleRow, dict_row

from sqlbroker.storage.plan import Plan, Query, Rows

T = TypeVar("T")


def _params(query: Query, now: datetime | None) -> dict[str, Any]:
    return {**query.params, "now": now}


def run(
    conn: psycopg.Connection[TupleRow], sql: Mapping[str, str], plan: Plan[T], now: datetime | None
) -> T:
    """Run ``plan`` on ``conn`` (inside whatever transaction the caller holds)."""
    try:
        query = next(plan)
        while True:
            cursor: psycopg.Cursor[Any] = (
                conn.cursor(row_factory=dict_row) if query.named else conn.cursor()
            )
            if query.each:
                params = _params(query, now)
                cursor.executemany(sql[query.block], [{**params, **row} for row in query.each])
                query = plan.send(Rows([], cursor.rowcount))
                continue
            cursor.execute(sql[query.block], _params(query, now))
            result = cursor.pgresult
            returned = result is not None and result.status == ExecStatus.TUPLES_OK
            rows = Rows(cursor.fetchall() if returned else [], cursor.rowcount)
            query = plan.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(
    conn: psycopg.AsyncConnection[TupleRow],
    sql: Mapping[str, str],
    plan: Plan[T],
    now: datetime | None,
) -> T:
    """:func:`run` on an async connection."""
    try:
        query = next(plan)
        while True:
            cursor: psycopg.AsyncCursor[Any] = (
                conn.cursor(row_factory=dict_row) if query.named else conn.cursor()
            )
            if query.each:
                params = _params(query, now)
                await cursor.executemany(
                    sql[query.block], [{**params, **row} for row in query.each]
                )
                query = plan.send(Rows([], cursor.rowcount))
                continue
            await cursor.execute(sql[query.block], _params(query, now))
            result = cursor.pgresult
            returned = result is not None and result.status == ExecStatus.TUPLES_OK
            rows = Rows(await cursor.fetchall() if returned else [], cursor.rowcount)
            query = plan.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
