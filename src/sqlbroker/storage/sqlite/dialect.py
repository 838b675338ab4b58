"""Running plans on ``sqlite3``: the SQLite dialect's encoding of parameters.

Times are stored as Unix seconds (``REAL``) and sequences travel as JSON arrays, which
the SQL unpacks with ``json_each``; rows come back as ``sqlite3.Row``, addressable by
position and by column name alike. SQLite has no data-changing statement inside a
``WITH``, so a block may hold several statements: they run in order with the same
parameters, and the last one's rows are the block's.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from sqlbroker.storage.plan import COMMIT_POINT, Plan, Query, Rows, drive
from sqlbroker.storage.schema import SchemaFiles

T = TypeVar("T")
_PLAIN = frozenset({str, int, float, bytes, bool, type(None)})


def encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, list | tuple):
        return json.dumps([item if type(item) in _PLAIN else encode(item) for item in value])
    return value


SCHEMA = SchemaFiles(
    package="sqlbroker.storage.sqlite", label="SQLite", migrate_hint="run `sqlbroker migrate`"
)


@functools.cache
def statements(script: str) -> tuple[str, ...]:
    """The statements of a block or a migration script, split once per text (a trailing
    part of comments alone is no statement)."""
    found: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            found.append(buffer.strip())
            buffer = ""
    if any(part.strip() and not part.strip().startswith("--") for part in buffer.splitlines()):
        found.append(buffer.strip())
    return tuple(found)


def split(sql: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """The statements of each block (:func:`statements`), split once for :func:`run`."""
    return {name: statements(body) for name, body in sql.items()}


def _encoded(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``params`` with each value :func:`encode`-d."""
    # Most statements bind plain values only: checked in one pass in C, then copied.
    if _PLAIN.issuperset(map(type, params.values())):
        return dict(params)
    return {k: v if type(v) in _PLAIN else encode(v) for k, v in params.items()}


def run(
    conn: sqlite3.Connection, sql: Mapping[str, tuple[str, ...]], plan: Plan[T], now: float
) -> T:
    """Run ``plan`` on ``conn`` (inside whatever transaction the caller holds, so that a
    commit point is nothing); ``sql``: each block's statements (:func:`split`)."""
    return drive(plan, stepper(conn, sql, now))


def stepper(
    conn: sqlite3.Connection, sql: Mapping[str, tuple[str, ...]], now: float
) -> Callable[[Query], Rows]:
    """The function that runs one statement of a plan on ``conn`` (a commit point: none)."""

    def step(query: Query) -> Rows:
        if query.block == COMMIT_POINT:
            return Rows([], 0)
        params = _encoded(query.params)
        params["now"] = now
        block = sql[query.block]
        if query.each:
            (statement,) = block
            cursor = conn.executemany(
                statement, [{**params, **_encoded(row)} for row in query.each]
            )
            return Rows([], cursor.rowcount)
        for statement in block[:-1]:
            conn.execute(statement, params)
        cursor = conn.execute(block[-1], params)
        return Rows(cursor.fetchall(), cursor.rowcount)

    return step
