"""Running plans on psycopg 3, sync and async: the PostgreSQL dialect.

Parameters go to psycopg as they are (sequences become arrays, times ``timestamptz``);
``now`` is the test clock's reading or ``NULL``, which the SQL replaces with the
database's own clock. Rows come back as tuples, or as dictionaries for a ``named`` query.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.abc import Transformer as Adapting
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import ExecStatus
from psycopg.pq.abc import PGconn, PGresult
from psycopg.rows import TupleRow, dict_row

from sqlbroker.core.errors import InvalidOption
from sqlbroker.storage.plan import (
    COMMIT_POINT,
    Plan,
    Query,
    Rows,
    StatementFailed,
    drive,
    drive_async,
)
from sqlbroker.storage.postgres.adapters import Strict
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
    """The complete schema script, version rows included (``sqlbroker schema --print``;
    ``PostgresBackend.schema_sql``), its tables in ``schema`` when given."""
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
    conn: psycopg.Connection[TupleRow],
    sql: Statements,
    plan: Plan[T],
    now: datetime | None,
    *,
    pooled: bool = False,
) -> T:
    """Run ``plan`` on ``conn`` (inside whatever transaction the caller holds). A query
    sent ``ahead`` waits for the next one, and both go in one pipeline: one round trip,
    one implicit transaction (the next statement sees what the first changed).
    ``pooled``: one of ours, in autocommit, outside any transaction, where a statement
    that fails alone (nothing held back went with it, not one run per row) is handed back
    to the plan: everything the plan ran before it has committed
    (:class:`~sqlbroker.storage.plan.StatementFailed`)."""
    held: list[Query] = []

    def step(query: Query) -> Rows:
        if query.ahead:
            held.append(query)
            return Rows([], -1)
        if query.block == COMMIT_POINT:  # each statement commits anyway, or the caller's
            return Rows([], 0)
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
            try:
                cursor.execute(sql[query.block], params)
            except psycopg.Error as error:
                if pooled:
                    raise StatementFailed(error) from error
                raise
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
    *,
    pooled: bool = False,
) -> T:
    """:func:`run` on an async connection; ``pooled`` as there, and its blocks of
    :data:`DIRECT` may go :func:`direct`."""
    held: list[Query] = []

    async def step(query: Query) -> Rows:
        if query.ahead:
            held.append(query)
            return Rows([], -1)
        if query.block == COMMIT_POINT:  # as in run
            return Rows([], 0)
        if (
            pooled
            and query.block in DIRECT
            and not held
            and not query.named
            and conn.prepare_threshold is not None  # None: behind a transaction pooler
        ):
            try:
                return await direct(conn, sql[query.block], _params(query, now))
            except psycopg.Error as error:
                raise StatementFailed(error) from error
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
            try:
                await cursor.execute(sql[query.block], params)
            except psycopg.Error as error:
                if pooled:
                    raise StatementFailed(error) from error
                raise
        return Rows(await cursor.fetchall() if _rows(cursor) else [], cursor.rowcount)

    done = await drive_async(plan, step)
    if held:
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


# --- a hot statement straight through libpq ---------------------------------------------------

DIRECT = frozenset(
    {
        "message_insert_queue_one",
        "message_claim",
        "message_complete",
        "message_complete_unarchived",
        "message_complete_keyed",
        "message_complete_unarchived_keyed",
    }
)
"""Blocks :func:`run_async` runs by :func:`direct` on a pooled connection: a single send's
statement, and the worker's claim and plain complete, where psycopg's cursor (its prepare
manager, result bookkeeping) and its wait (a timer and a poll beside the selector
registration, per wait) were most of the client's work."""

_PLACEHOLDER = re.compile(rb"%%|%\((\w+)\)([sbt])")
_FORMATS = {b"s": PyFormat.AUTO, b"b": PyFormat.BINARY, b"t": PyFormat.TEXT}


class _Libpq:
    """A block in libpq's terms: its text with ``$n`` placeholders, and the names and
    formats of its parameters in their order."""

    __slots__ = ("formats", "names", "text")

    def __init__(self, sql: bytes) -> None:
        self.names: list[str] = []
        self.formats: list[PyFormat] = []
        numbers: dict[str, bytes] = {}

        def number(match: re.Match[bytes]) -> bytes:
            if match.group(1) is None:
                return b"%"
            name = match.group(1).decode()
            if name not in numbers:
                self.names.append(name)
                self.formats.append(_FORMATS[match.group(2)])
                numbers[name] = b"$%d" % len(self.names)
            return numbers[name]

        self.text = _PLACEHOLDER.sub(number, sql)


_libpq: dict[bytes, _Libpq] = {}
_SESSION = "_sqlbroker_direct"
"""The attribute of a connection holding :func:`direct`'s state there: its adapter (its
dumpers and loaders found once, the loaders
:class:`~sqlbroker.storage.postgres.adapters.Strict`), the statements it prepared, by text
and parameter types, and the loop it belongs to. On the connection, not in a weak map keyed
by it: the adapter refers to the connection, so a map's entry would keep it alive forever."""


async def direct(
    conn: psycopg.AsyncConnection[TupleRow], sql: bytes, params: Mapping[str, Any]
) -> Rows:
    """Run one statement on ``conn`` (idle, in autocommit, not shared) as a statement
    prepared on it, driving libpq directly: one send, one wait for the socket, no timer.
    Errors are psycopg's (the caller translates them). Interrupted while the statement
    runs, the server is asked to cancel it and the connection is left busy, which the pool
    closes instead of reusing."""
    libpq = _libpq.get(sql)
    if libpq is None:
        libpq = _libpq[sql] = _Libpq(sql)
    session: tuple[Adapting, dict[Any, bytes], asyncio.AbstractEventLoop] | None
    session = getattr(conn, _SESSION, None)
    if session is None:
        session = (Transformer(Strict(conn)), {}, asyncio.get_running_loop())
        setattr(conn, _SESSION, session)
    dumper, prepared, loop = session
    values = dumper.dump_sequence([params[name] for name in libpq.names], libpq.formats)
    pgconn = conn.pgconn
    key = (sql, dumper.types)  # the text, not the block's name: it holds the schema
    name = prepared.get(key)
    if name is None:
        name = b"sqlbroker_%d" % len(prepared)
        pgconn.send_prepare(name, libpq.text, param_types=dumper.types)
        _check(conn, await _result(conn, pgconn, loop))
        prepared[key] = name
    pgconn.send_query_prepared(name, values, param_formats=dumper.formats)
    result = _check(conn, await _result(conn, pgconn, loop))
    rowcount = result.command_tuples
    if result.status != ExecStatus.TUPLES_OK:
        return Rows([], -1 if rowcount is None else rowcount)
    dumper.set_pgresult(result)
    try:
        rows = dumper.load_rows(0, result.ntuples, tuple)
    except psycopg.DataError:
        tolerant = Transformer(conn)  # the connection's own loaders read what Strict refuses
        tolerant.set_pgresult(result)
        rows = tolerant.load_rows(0, result.ntuples, tuple)
    return Rows(rows, len(rows) if rowcount is None else rowcount)


def _check(conn: psycopg.AsyncConnection[Any], result: PGresult | None) -> PGresult:
    if result is None or result.status == ExecStatus.FATAL_ERROR:
        if result is None:
            raise psycopg.OperationalError("the server sent no result")
        raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    return result


async def _result(
    conn: psycopg.AsyncConnection[Any], pgconn: PGconn, loop: asyncio.AbstractEventLoop
) -> PGresult | None:
    """The last result of the statement just sent, read when libpq has it all."""
    try:
        socket = pgconn.socket
        while pgconn.flush():  # nonblocking: part of it is still to go
            await _ready(loop, socket, write=True)
        last = None
        while True:
            if pgconn.is_busy():
                await _ready(loop, socket, write=False)
                pgconn.consume_input()
                continue
            result = pgconn.get_result()
            if result is None:
                return last
            last = result
    except BaseException as error:
        if not isinstance(error, psycopg.Error) and not conn.closed:
            # Cancelled (or interrupted) with the statement in flight: as psycopg does,
            # ask the server to stop it; the connection goes back busy, and is closed.
            with contextlib.suppress(Exception):  # the interruption is what matters
                if hasattr(conn, "cancel_safe"):  # psycopg 3.2 and later
                    await conn.cancel_safe(timeout=5.0)
                else:
                    conn.cancel()
        raise


async def _ready(loop: asyncio.AbstractEventLoop, socket: int, *, write: bool) -> None:
    ready = loop.create_future()
    if write:
        loop.add_writer(socket, _wake, ready)
    else:
        loop.add_reader(socket, _wake, ready)
    try:
        await ready
    finally:
        if write:
            loop.remove_writer(socket)
        else:
            loop.remove_reader(socket)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
