"""PostgreSQL keeps one plan for the plain claim (issue 24's drain): its prepared statement
is planned once, not before every claim, and that one plan probes the primary key for the
copies it leases instead of hashing the whole hot table. Work and plan counts, not time:
``pg_prepared_statements`` counts the session's generic and custom plans, EXPLAIN ANALYZE
the rows the scans of the message table read."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from tests.seam.support import new_message

from sqlbroker.storage.backend import Backend
from sqlbroker.storage.factory import open_backend
from sqlbroker.storage.sql import load_sql

BACKLOG = 2_000
LIMIT = 14
PARAMS: dict[str, Any] = {
    "subscription": "q",
    "limit": LIMIT,
    "now": None,
    "lease": 30.0,
    "worker": "plan-test",
    "max_attempts": None,
    "claim_commit": "on",
}


@pytest.fixture
def filled(pg_url: str) -> str:
    backend: Backend = open_backend(pg_url)
    backend.migrate()
    try:
        messages = [new_message("q", {"n": n}) for n in range(BACKLOG)]
        for start in range(0, BACKLOG, 500):
            backend.message_insert_many(messages=messages[start : start + 500], subscription="q")
    finally:
        backend.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return pg_url


def test_the_claim_keeps_one_generic_plan(filled: str) -> None:
    claim = load_sql("sqlbroker.storage.postgres")["message_claim"]
    with psycopg.connect(filled) as conn:
        for _ in range(10):
            rows = conn.execute(claim, PARAMS, prepare=True).fetchall()
            assert len(rows) == LIMIT
        (generic, custom) = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%sqlbroker_message%%'"
        ).fetchone() or (0, 0)
        conn.rollback()
    # PostgreSQL plans the first five executions for their values, then keeps the generic
    # plan when it costs no more than they did.
    assert (generic, custom) == (5, 5)


def _message_rows_read(node: dict[str, Any]) -> int:
    rows = 0
    if node.get("Relation Name") == "sqlbroker_message" and "Scan" in node["Node Type"]:
        found = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        rows += int(found * node["Actual Loops"])
    return rows + sum(_message_rows_read(child) for child in node.get("Plans", []))


def test_the_generic_claim_plan_reads_its_batch_not_the_backlog(filled: str) -> None:
    claim = load_sql("sqlbroker.storage.postgres")["message_claim"]
    names: list[str] = []

    def positional(found: re.Match[str]) -> str:
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", positional, claim)
    with psycopg.connect(filled) as conn:
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE claim AS {prepared}")
        values = ", ".join(psycopg.sql.quote(PARAMS[name], conn) for name in names)
        (plan,) = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim({values})"
        ).fetchone() or (None,)
        conn.rollback()
    # The batch (and the index entries of copies claimed before), far from the backlog.
    assert _message_rows_read(plan[0]["Plan"]) < 4 * LIMIT
