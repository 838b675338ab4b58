"""A statement that fails alone on one of PostgreSQL's pooled autocommit connections is
handed back to its plan (plan.StatementFailed): the statements before it committed, and a
plan may carry on; uncaught, the driver's own error goes on (the backend translates it).
Inside a transaction nothing is handed back. The operation that relies on it, a keyed
settle whose promotion fails: tests/seam/test_settle.py."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from sqlbroker.storage.plan import Plan, StatementFailed, query
from sqlbroker.storage.postgres import dialect

SQL = {
    "write": b"INSERT INTO written VALUES (%(n)s)",
    "fail": b"SELECT 1 / 0",
}


def carries_on() -> Plan[str]:
    yield query("write", n=1)
    try:
        yield query("fail")
    except StatementFailed as failed:
        yield query("write", n=2)
        return str(failed)
    return "not failed"


def gives_up() -> Plan[None]:
    yield query("write", n=1)
    yield query("fail")


def _written(conn: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in conn.execute("SELECT n FROM written ORDER BY n")]


@pytest.fixture
def conn(pg_url: str) -> Any:
    with psycopg.connect(pg_url, autocommit=True) as opened:
        opened.execute("CREATE TEMP TABLE written (n int)")
        yield opened


def test_a_failure_alone_is_handed_to_the_plan_which_may_carry_on(conn: Any) -> None:
    assert dialect.run(conn, SQL, carries_on(), None, pooled=True) == "division by zero"
    assert _written(conn) == [1, 2]


def test_uncaught_it_is_the_drivers_error_and_what_came_before_stays(conn: Any) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        dialect.run(conn, SQL, gives_up(), None, pooled=True)
    assert _written(conn) == [1]


def test_in_a_transaction_nothing_is_handed_back(conn: Any) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
        dialect.run(conn, SQL, carries_on(), None)
    assert _written(conn) == []


def test_the_async_runner_hands_it_back_too(pg_url: str) -> None:
    async def scenario() -> tuple[str, list[int]]:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute("CREATE TEMP TABLE written (n int)")
            done = await dialect.run_async(conn, SQL, carries_on(), None, pooled=True)
            cursor = await conn.execute("SELECT n FROM written ORDER BY n")
            return done, [row[0] for row in await cursor.fetchall()]

    assert asyncio.run(scenario()) == ("division by zero", [1, 2])
