"""Running plans on psycopg 3, sync and async: the PostgreSQL dialect.

Parameters go to psycopg as they are (sequences become arrays, times ``timestamptz``);
``now`` is the test clock's reading or ``NULL``, which the SQL replaces with the
database's own clock. Rows come back as tuples, or as dictionaries for a ``named`` query.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import TupleRow, dict_row

from sqlbroker.core.errors import InvalidOption
from sqlbroker.storage.plan import Plan, Query, Rows, drive, drive_async
from sqlbroker.storage.schema import SchemaFiles
from sqlbroker.storage.sql import load_blocks

T = TypeVar("T")
SCHEMA = SchemaFiles(
    package="sqlbroker.storage.postgres",
    label="PostgreSQL",
    migrate_hint="run `sqlbroker migrate` as the migrator role (the schema's owner)",
)
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def qualifier(schema: str | None) -> str:
    """The prefix naming ``schema`` in SQL (``"name".``; empty for the search path)."""
    if schema is None:
        return ""
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise InvalidOption(
            "schema", "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63)"
        )
    return f'"{schema}".'


MAX_IDENTIFIER = 63
"""Bytes of a PostgreSQL identifier (NAMEDATALEN - 1): a longer channel name is cut short
by LISTEN and refused by ``pg_notify``."""


def channel_name(schema: str | None, suffix: str = "") -> str:
    """The NOTIFY channel ``suffix`` (``""``, ``"_dead"``, ``"_result"``, ``"_cancel"``) of
    the tables in ``schema``: ``sqlbroker[_<schema>]<suffix>``; when that passes
    :data:`MAX_IDENTIFIER` bytes, the schema part is cut short and followed by a hash of
    it, so that two long schema names keep channels of their own."""
    stem = "sqlbroker" if schema is None else f"sqlbroker_{schema}"
    if len(f"{stem}{suffix}".encode()) <= MAX_IDENTIFIER:
        return f"{stem}{suffix}"
    digest = hashlib.sha256(stem.encode()).hexdigest()[:16]
    head = stem[: MAX_IDENTIFIER - len(suffix) - len(digest) - 1]
    return f"{head}_{digest}{suffix}"


def schema_sql(schema: str | None = None) -> str:
    """The complete schema script (``sqlbroker schema --print``), its tables in ``schema``
    when given."""
    prefix = qualifier(schema)
    create = load_blocks(SCHEMA.package, "queries.sql")["schema_create"]
    preamble = [create.replace("{name}", prefix[:-1]) + ";"] if schema else []
    return SCHEMA.script(prefix, preamble)


Statements = Mapping[str, bytes]
"""The blocks :func:`run` takes: :func:`encoded`."""


def encoded(sql: Mapping[str, str]) -> dict[str, bytes]:
    """The blocks as the bytes psycopg sends: given ``str``, it encodes the text on every
    execute and hashes the new bytes to look up its parse (a few microseconds for a
    statement of some kilobytes); the same ``bytes`` object keeps its hash."""
    return {name: body.encode() for name, body in sql.items()}


def _params(query: Query, now: datetime | None) -> dict[str, Any]:
    return {**query.params, "now": now}


def _rows(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement just run returned rows (``cursor.description`` tells too, but
    builds a column list to do it)."""
    result = cursor.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


def run(
    conn: psycopg.Connection[TupleRow], sql: Statements, plan: Plan[T], now: datetime | None
) -> T:
    """Run ``plan`` on ``conn`` (inside whatever transaction the caller holds). A query
    sent ``ahead`` waits for the next one, and both go in one pipeline: one round trip,
    one implicit transaction (the next statement sees what the first changed)."""
    held: list[Query] = []

    def step(query: Query) -> Rows:
        if query.ahead:
            held.append(query)
            return Rows([], -1)
        cursor: psycopg.Cursor[Any] = (
            conn.cursor(row_factory=dict_row) if query.named else conn.cursor()
        )
        params = _params(query, now)
        if query.each:
            _send(conn, sql, held, now)
            cursor.executemany(sql[query.block], [{**params, **row} for row in query.each])
            return Rows([], cursor.rowcount)
        if held:
            with conn.pipeline():  # its exit syncs: the rows are there after it
                _send(conn, sql, held, now)
                cursor.execute(sql[query.block], params)
        else:
            cursor.execute(sql[query.block], params)
        return Rows(cursor.fetchall() if _rows(cursor) else [], cursor.rowcount)

    done = drive(plan, step)
    _send(conn, sql, held, now)  # held by a plan that ended right after it
    return done


def _send(
    conn: psycopg.Connection[TupleRow],
    sql: Mapping[str, str | bytes],
    held: list[Query],
    now: datetime | None,
) -> None:
    """Run the queries held back, in order, and forget them."""
    for query in held:
        conn.execute(sql[query.block], _params(query, now))
    held.clear()


async def run_async(
    conn: psycopg.AsyncConnection[TupleRow],
    sql: Statements,
    plan: Plan[T],
    now: datetime | None,
) -> T:
    """:func:`run` on an async connection."""
    held: list[Query] = []

    async def step(query: Query) -> Rows:
        if query.ahead:
            held.append(query)
            return Rows([], -1)
        cursor: psycopg.AsyncCursor[Any] = (
            conn.cursor(row_factory=dict_row) if query.named else conn.cursor()
        )
        params = _params(query, now)
        if query.each:
            await _send_async(conn, sql, held, now)
            await cursor.executemany(sql[query.block], [{**params, **row} for row in query.each])
            return Rows([], cursor.rowcount)
        if held:
            async with conn.pipeline():
                await _send_async(conn, sql, held, now)
                await cursor.execute(sql[query.block], params)
        else:
            await cursor.execute(sql[query.block], params)
        return Rows(await cursor.fetchall() if _rows(cursor) else [], cursor.rowcount)

    done = await drive_async(plan, step)
    await _send_async(conn, sql, held, now)
    return done


async def _send_async(
    conn: psycopg.AsyncConnection[TupleRow],
    sql: Mapping[str, str | bytes],
    held: list[Query],
    now: datetime | None,
) -> None:
    for query in held:
        await conn.execute(sql[query.block], _params(query, now))
    held.clear()
