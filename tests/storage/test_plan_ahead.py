"""A statement sent ``ahead`` (plan.ahead): PostgreSQL's dialect holds it back and sends it
with the plan's next statement in one pipeline — one round trip, one implicit transaction —
and still runs it when the plan ends right after it or goes on with a batch (``each``).
The broker-level case, a claim and its promotion: tests/seam/test_messages.py."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from sqlbroker.storage.plan import Plan, Rows, ahead, each, query
from sqlbroker.storage.postgres import dialect

SQL = {
    "mark": "SELECT set_config('sqlbroker.mark', 'held', true)",
    "read": "SELECT current_setting('sqlbroker.mark', true)",
    "name": "SELECT set_config('application_name', %(name)s, false)",
    "append": "SELECT set_config('application_name',"
    " current_setting('application_name') || %(name)s, false)",
    "named": "SELECT current_setting('application_name')",
}


def together() -> Plan[tuple[Rows, Any]]:
    held = yield ahead("mark")
    rows = yield query("read")
    return held, rows[0][0]


def test_an_ahead_statement_and_the_next_run_in_one_transaction(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        held, mark = dialect.run(conn, SQL, together(), None)
        assert (list(held), mark) == ([], "held")
        # Transaction-local, so gone once that one transaction committed.
        assert conn.execute(SQL["read"]).fetchone() in [("",), (None,)]


def test_the_async_dialect_sends_it_along_too(pg_url: str) -> None:
    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            return await dialect.run_async(conn, SQL, together(), None)

    held, mark = asyncio.run(main())
    assert (list(held), mark) == ([], "held")


def test_a_held_statement_runs_when_the_plan_ends_or_goes_on_with_a_batch(pg_url: str) -> None:
    def last() -> Plan[None]:
        yield ahead("name", name="last")

    def batch() -> Plan[str]:
        yield query("name", name="")
        yield ahead("append", name="1")
        yield each("append", [{"name": "2"}, {"name": "3"}])
        rows = yield query("named")
        return str(rows[0][0])

    with psycopg.connect(pg_url, autocommit=True) as conn:
        dialect.run(conn, SQL, last(), None)
        assert conn.execute(SQL["named"]).fetchone() == ("last",)
        # In order: the held one first, then the batch's rows.
        assert dialect.run(conn, SQL, batch(), None) == "123"
