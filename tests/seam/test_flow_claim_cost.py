"""A fair or key-limited claim costs its batch and the keys it touches, not the backlog
(issue 26): the work of one flow claim with 2,000 keys waiting is about the work with 100
keys waiting, on both dialects. Work, not time: SQLite's virtual-machine steps (a progress
handler) and the rows PostgreSQL's scans read (EXPLAIN ANALYZE), so the check does not
depend on how busy the machine is. Ranking the whole backlog, as the claim once did, does
20 times the work here."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import psycopg
import pytest
from tests.seam.support import new_message

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.flow import flow_limits
from sqlbroker.storage.sql import load_sql
from sqlbroker.storage.sqlite.dialect import statements

LIMIT = 10


def fill(backend: Any, queue: str, keys: int, options: dict[str, object]) -> None:
    messages = [new_message(queue, {"n": n}, key=f"k{n % keys}") for n in range(2 * keys)]
    for start in range(0, len(messages), 1000):
        backend.message_insert_many(messages=messages[start : start + 1000], subscription=queue)
    assert backend.flow_set(name=queue, limits=flow_limits(options))


def sqlite_work(path: str, queue: str, now: float) -> int:
    """VM steps (in thousands) of the statement that picks the copies to claim."""
    pick = statements(load_sql("sqlbroker.storage.sqlite")["message_claim_flow"])[2]
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn = sqlite3.connect(path)
    try:
        conn.execute(
            "CREATE TEMP TABLE IF NOT EXISTS sqlbroker_flow_pick"
            " (id INTEGER PRIMARY KEY, ordering_key TEXT)"
        )
        conn.set_progress_handler(count, 1000)
        conn.execute(pick, {"subscription": queue, "limit": LIMIT, "now": now})
        picked = conn.execute("SELECT count(*) FROM temp.sqlbroker_flow_pick").fetchone()[0]
        assert picked == LIMIT
        return steps
    finally:
        conn.close()


def postgres_work(url: str, queue: str) -> int:
    """Rows of the message table the claim statement reads (those its scans return and
    those their filters drop), from EXPLAIN ANALYZE, rolled back: nothing is claimed."""
    claim = load_sql("sqlbroker.storage.postgres")["message_claim_flow"]
    params = {
        "subscription": queue,
        "limit": LIMIT,
        "now": None,
        "lease": 30,
        "worker": "cost",
        "max_attempts": None,
        "claim_commit": "on",
    }
    with psycopg.connect(url) as conn:
        conn.execute("ANALYZE")
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim, params).fetchone()
        conn.rollback()

    def read(node: dict[str, Any]) -> int:
        rows = 0
        if node.get("Relation Name") == "sqlbroker_message" and "Scan" in node["Node Type"]:
            found = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            rows += int(found * node["Actual Loops"])
        return rows + sum(read(child) for child in node.get("Plans", []))

    return read((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])


@pytest.mark.parametrize(
    "options", [{"fair": True}, {"key_concurrency": 2}], ids=["fair", "key_concurrency"]
)
def test_a_flow_claim_costs_the_keys_it_touches_not_the_backlog(
    backend: Any, backend_url: str, clock: ManualClock, options: dict[str, object]
) -> None:
    if backend_url.startswith("sqlite"):
        path = backend_url.removeprefix("sqlite:///")
        started = clock.now()
        assert started is not None

        def work(queue: str) -> int:
            return sqlite_work(path, queue, started.timestamp() + 1)
    else:

        def work(queue: str) -> int:
            return postgres_work(backend_url, queue)

    # The few keys are measured before the many are published: a claim that read the
    # whole table would read little then, and a lot with the many.
    fill(backend, "few", 100, options)
    few = work("few")
    fill(backend, "many", 2_000, options)
    many = work("many")
    assert many < 2 * few, (few, many)
