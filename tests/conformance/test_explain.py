"""The claim query stays an index scan as the backlog grows (DESIGN §8): with 200,000 rows
in the hot table it reads the partial index ``sqlbroker_message_claim`` in order, with no
full scan and no sort. The plan is taken of the broker's own claim statement (EXPLAIN never
executes it)."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import sqlbroker
from helpers import claim_one, table_counts

ROWS = 200_000
BATCH = 10_000


def _fill(broker: sqlbroker.Broker) -> None:
    for start in range(0, ROWS, BATCH):
        broker.send_many("big", range(start, start + BATCH), priority=start // BATCH % 10)
    # A second subscription's rows share the table and must not be read.
    broker.send_many("other", range(BATCH))
    assert table_counts(broker.backend)["sqlbroker_message"] == ROWS + BATCH


def _claim_sql(broker: sqlbroker.Broker) -> str:
    sql: dict[str, str] = broker.backend._sql  # type: ignore[attr-defined]
    return sql["message_claim"]


def _inner_select(claim_sql: str) -> str:
    """The SELECT that picks the ids to claim (inside ``IN (…)`` or the CTE)."""
    match = re.search(
        r"\(\s*(SELECT\s+id\s+FROM\s.*?)\)\s*(?:UPDATE|RETURNING|$)", claim_sql, re.S | re.I
    )
    assert match, f"cannot find the inner SELECT of the claim query:\n{claim_sql}"
    return match.group(1)


def _params(broker: sqlbroker.Broker) -> dict[str, Any]:
    now = broker.backend.now()
    if broker.backend_name == "sqlite":
        now_value: Any = now.timestamp()
    else:
        now_value = now
    return {
        "subscription": "big",
        "now": now_value,
        "lease": 30.0,
        "limit": 10,
        "worker": "explain",
        "max_attempts": None,
        "claim_commit": "off",
        "token": "0" * 32,
    }


def _sqlite_plan(broker: sqlbroker.Broker, sql: str) -> list[str]:
    path = broker.url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    try:
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, _params(broker))]
    finally:
        conn.close()


def _pg_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _pg_nodes(child)


def _pg_plan(broker: sqlbroker.Broker, url: str, sql: str) -> list[dict[str, Any]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        # Autovacuum would analyze a table this size within a minute in production; do it now
        # so the planner sees the same statistics instead of racing the daemon.
        conn.execute("ANALYZE sqlbroker_message")
        row = conn.execute(("EXPLAIN (FORMAT JSON) " + sql).encode(), _params(broker)).fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return list(_pg_nodes(document[0]["Plan"]))


def test_claim_uses_its_partial_index_without_scan_or_sort(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    _fill(broker)
    claim_sql = _claim_sql(broker)
    inner = _inner_select(claim_sql)
    if broker.backend_name == "sqlite":
        for sql in (inner, claim_sql):
            details = _sqlite_plan(broker, sql)
            text = "\n".join(details)
            assert re.search(r"USING (COVERING )?INDEX sqlbroker_message_claim\b", text), text
            assert "TEMP B-TREE" not in text, text
            assert not any(re.match(r"SCAN sqlbroker_message\b", d) for d in details), text
    else:
        for sql in (inner, claim_sql):
            nodes = _pg_plan(broker, backend_url, sql)
            summary = [(n["Node Type"], n.get("Index Name"), n.get("Relation Name")) for n in nodes]
            assert any(
                n["Node Type"] in ("Index Scan", "Index Only Scan")
                and n.get("Index Name") == "sqlbroker_message_claim"
                for n in nodes
            ), summary
            assert not any(
                n["Node Type"] in ("Seq Scan", "Sort", "Incremental Sort") for n in nodes
            ), summary
    # And the real claim still returns the most urgent message.
    delivery = claim_one(broker, "big")
    assert (delivery.priority, delivery.payload) == (0, 0)


def test_settling_leases_probes_the_primary_key_not_every_running_copy(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """An ack (and a retry, dead-letter, extend or release) finds its copies by id: with
    thousands of copies running it must not scan the lease index and hash-join them all."""
    if broker.backend_name == "sqlite":
        return  # SQLite's statements look the leases up by id from a JSON list.
    import psycopg

    broker.send_many("busy", range(5_000))
    with psycopg.connect(backend_url, autocommit=True) as conn:
        # Statistics taken while nothing ran (as autovacuum often finds a busy queue), then
        # thousands of copies claimed: the estimate says one copy is running.
        conn.execute("ANALYZE sqlbroker_message")
    running = [d for _ in range(4) for d in broker.claim("busy", limit=500)]
    sql: dict[str, str] = broker.backend._sql  # type: ignore[attr-defined]
    params = {
        "ids": [d.id for d in running[:10]],
        "tokens": [d.lease_token for d in running[:10]],
        "now": None,
        "lease": 30.0,
    }
    with psycopg.connect(backend_url, autocommit=True) as conn:
        names = ("message_complete", "message_complete_unarchived", "message_extend")
        keyed = ("message_complete_keyed", "message_complete_unarchived_keyed")
        for name in (*names, "message_release", *keyed):
            row = conn.execute(("EXPLAIN (FORMAT JSON) " + sql[name]).encode(), params).fetchone()
            assert row is not None
            nodes = list(_pg_nodes(row[0][0]["Plan"]))
            scans = [n for n in nodes if n["Node Type"].endswith("Scan")]
            indexes = {
                n.get("Index Name") for n in scans if n.get("Relation Name") == "sqlbroker_message"
            }
            # A keyed complete promotes its keys' next copies in the same statement, by key
            # (see test_a_key_promotion_probes_the_key_not_the_hot_table).
            allowed = {"sqlbroker_message_pkey"}
            if name in keyed:
                allowed |= {"sqlbroker_message_key", "sqlbroker_message_key_head"}
            assert "sqlbroker_message_pkey" in indexes, (name, indexes)
            assert indexes <= allowed, (name, indexes)


def test_a_key_promotion_probes_the_key_not_the_hot_table(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """After a keyed ack, "has this key a head?" is one probe of the key-head index and the
    next copy one step of the key index: no statement-wide scan of the hot table, whose
    cost grew with the whole backlog (1.4 ms per keyed ack with 12,000 copies waiting)."""
    for key in range(40):
        broker.send_many("keyed", range(500), key=f"k{key}")
    heads = broker.claim("keyed", limit=40)
    assert len(heads) == 40
    sql: dict[str, str] = broker.backend._sql  # type: ignore[attr-defined]
    if broker.backend_name == "sqlite":
        path = broker.url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path)
        try:
            conn.execute("ANALYZE")
            params = {"subscriptions": json.dumps(["keyed"]), "keys": json.dumps(["k0"])}
            details = [
                row[3]
                for row in conn.execute(
                    "EXPLAIN QUERY PLAN " + sql["key_promote"], {**params, "now": 0.0}
                )
            ]
        finally:
            conn.close()
        text = "\n".join(details)
        assert "sqlbroker_message_key_head" in text, text
        assert not any(re.match(r"SCAN (sqlbroker_message|b|o)\b", d) for d in details), text
        return
    import psycopg

    # PostgreSQL promotes in key_promote, and in a keyed complete's own statement.
    params = {
        "subscriptions": ["keyed"],
        "keys": ["k0"],
        "ids": [d.id for d in heads[:10]],
        "tokens": [d.lease_token for d in heads[:10]],
        "now": None,
    }
    with psycopg.connect(backend_url, autocommit=True) as conn:
        conn.execute("ANALYZE sqlbroker_message")
        rows = [
            conn.execute(("EXPLAIN (FORMAT JSON) " + sql[name]).encode(), params).fetchone()
            for name in (
                "key_promote",
                "message_complete_keyed",
                "message_complete_unarchived_keyed",
            )
        ]
    for row in rows:
        assert row is not None
        document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        nodes = list(_pg_nodes(document[0]["Plan"]))
        summary = [(n["Node Type"], n.get("Index Name"), n.get("Relation Name")) for n in nodes]
        assert any(n.get("Index Name") == "sqlbroker_message_key_head" for n in nodes), summary
        assert not any(
            n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "sqlbroker_message"
            for n in nodes
        ), summary
