"""What the SQLite drain's statements cost, in load-independent terms.

A claim keeps no statement journal. SQLite keeps one for a statement that may fail halfway
(its default ABORT, or any function call in it) and, past 64 KiB (a claim of 100 copies),
spills it into a temporary file created in the claim and held open, deleted, until the
transaction ends. The claim's UPDATE runs OR FAIL, its lease tokens made of the claim's
random token and each copy's id; a failure of the claim still undoes all of it."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from sqlbroker.core.message import Delivery
from sqlbroker.storage.factory import open_backend
from sqlbroker.storage.plan import WRITE, Plan, commit_point, query
from sqlbroker.storage.sql import load_sql

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/fd")


def _temporary_files() -> list[str]:
    """SQLite's temporary files this process holds open (named ``etilqs_…``)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "etilqs_" in target:
            found.append(target)
    return found


def _published(path: Path, count: int) -> str:
    url = f"sqlite:///{path}"
    with sqlbroker.Broker(url) as broker:
        broker.send_many("jobs", [{"n": n, "pad": "x" * 300} for n in range(count)])
    return url


def test_a_claim_of_100_writes_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    _published(path, 150)
    claim = load_sql("sqlbroker.storage.sqlite")["message_claim"]
    params = {
        "subscription": "jobs",
        "limit": 100,
        "now": time.time(),
        "lease": 60,
        "worker": None,
        "max_attempts": None,
        "token": os.urandom(16).hex(),
    }
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")  # as the backend's own write transaction
        rows = conn.execute(claim, params).fetchall()
        held = _temporary_files()  # before the commit closes any
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert (len(rows), held) == (100, [])
    assert len({row[-2] for row in rows}) == 100  # one lease token per copy


def _claim(url: str, conn: sqlite3.Connection, limit: int) -> list[Delivery]:
    """A claim in the caller's transaction (``conn``), through the storage seam."""
    backend = open_backend(url)
    try:
        with backend.begin(conn) as tx:
            return tx.message_claim_many(subscription="jobs", limit=limit, lease=60, worker=None)
    finally:
        backend.close()


def test_a_claim_that_fails_halfway_in_a_callers_transaction_leases_nothing(
    tmp_path: Path,
) -> None:
    """A claim that fails halfway (here SQLite runs out of pages as the leased rows grow)
    raises ``StorageFull`` and leases nothing: without a statement journal SQLite cannot
    undo the statement alone and rolls the caller's transaction back, as a complete's."""
    path = tmp_path / "broker.db"
    url = _published(path, 150)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("VACUUM")  # no free pages left for the leased rows to grow into
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlbroker.StorageFull):
            _claim(url, conn, 100)
        if conn.in_transaction:
            conn.rollback()
        running = conn.execute(
            "SELECT count(*) FROM sqlbroker_message WHERE state = 'running'"
        ).fetchone()
    finally:
        conn.close()
    assert running == (0,)
    with sqlbroker.Broker(url) as broker:
        claimed = broker.claim("jobs", limit=150)
        assert len(claimed) == 150  # none was left leased
        broker.complete(claimed)
        assert broker.pending("jobs") == []


def _steps(conn: sqlite3.Connection, sql: str, params: dict[str, object]) -> tuple[int, int]:
    """SQLite engine steps of one statement, and the rows it changed."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 1)
    try:
        conn.execute(sql, params)
    finally:
        conn.set_progress_handler(None, 1)
    return steps, conn.execute("SELECT changes()").fetchone()[0]


def test_a_key_promotion_costs_little_more_than_updating_the_copies_it_promotes(
    tmp_path: Path,
) -> None:
    """After a complete of 10 keys' heads, their promotion against an UPDATE of the same
    10 next copies by id (its floor): 1.90 times the floor's engine steps with RETURNING and
    DISTINCT, 1.47 without."""
    path = tmp_path / "broker.db"
    with sqlbroker.Broker(f"sqlite:///{path}") as broker:
        for key in range(64):
            broker.send_many("jobs", [{"n": n, "pad": "x" * 150} for n in range(30)], key=f"k{key}")
        heads = broker.claim("jobs", limit=10)
    keys = sorted({d.key for d in heads if d.key is not None})
    assert len(keys) == 10
    promote = load_sql("sqlbroker.storage.sqlite")["key_promote"]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        following = [
            conn.execute(
                "SELECT min(id) FROM sqlbroker_message"
                " WHERE ordering_key = ? AND state = 'blocked'",
                (key,),
            ).fetchone()[0]
            for key in keys
        ]
        removed = ",".join(str(d.id) for d in heads)
        costs = []
        for sql, params in (
            (promote, {"subscriptions": json.dumps(["jobs"] * 10), "keys": json.dumps(keys)}),
            (
                "UPDATE sqlbroker_message"
                " SET state = CASE WHEN available_at > :now THEN 'scheduled' ELSE 'available' END"
                " WHERE id IN (SELECT value FROM json_each(:ids))",
                {"ids": json.dumps(following)},
            ),
        ):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"DELETE FROM sqlbroker_message WHERE id IN ({removed})")
            costs.append(_steps(conn, sql, {**params, "now": time.time()}))
            conn.execute("ROLLBACK")
    finally:
        conn.close()
    (promotion, promoted), (floor, updated) = costs
    assert (promoted, updated) == (10, 10)
    assert promotion < 1.7 * floor, (promotion, floor)


def _subscriptions(path: Path) -> list[str] | None:
    """The subscriptions another connection sees; None while a write holds the lock."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        conn.close()
        return None
    try:
        return sorted(row[0] for row in conn.execute("SELECT name FROM sqlbroker_subscription"))
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_plan_commits_at_its_commit_point_and_writes_after_it_in_a_new_transaction(
    tmp_path: Path,
) -> None:
    """What lets a claim decode its rows outside the write lock (SQLite's claim decodes
    after a commit point): run alone, the writes before the point are committed and the
    lock is free while the plan goes on; a write after it runs in a transaction of its
    own. In a transaction the plan does not own (``begin``), the point changes nothing."""
    path = tmp_path / "broker.db"
    backend = open_backend(f"sqlite:///{path}")
    backend.migrate()
    seen: list[list[str] | None] = []

    def plan(first: str, second: str) -> Plan[str]:
        yield query("queue_create", name=first)
        yield commit_point()
        seen.append(_subscriptions(path))
        yield query("queue_create", name=second)
        return second

    try:
        assert backend.execute(plan("a", "b"), WRITE) == "b"
        assert seen == [["a"]]  # committed, and the lock free
        assert _subscriptions(path) == ["a", "b"]
        with backend.begin() as tx:
            assert tx.execute(plan("c", "d"), WRITE) == "d"
        assert seen == [["a"], None]  # still in the transaction at the point
        assert _subscriptions(path) == ["a", "b", "c", "d"]
    finally:
        backend.close()


@pytest.mark.parametrize("limits", [None, {"max_running": 1_000}], ids=["plain", "flow"])
def test_a_claim_decodes_its_rows_after_it_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limits: dict[str, int] | None
) -> None:
    """The plain claim and the flow-limited claim both free the write lock before their
    rows are decoded (about 8 us a row, while the other threads wait to write)."""
    from tests.seam.support import claim, publish

    from sqlbroker.core.flow import flow_limits
    from sqlbroker.storage.operations import flow

    path = tmp_path / "broker.db"
    backend = open_backend(f"sqlite:///{path}")
    backend.migrate()
    lock_free: list[bool] = []
    decode = flow.deliveries_of

    def watched(rows: Any) -> Any:
        if rows:
            lock_free.append(_subscriptions(path) is not None)
        return decode(rows)

    try:
        publish(backend, "jobs", 3)
        if limits is not None:
            assert backend.flow_set(name="jobs", limits=flow_limits(limits))
        monkeypatch.setattr(flow, "deliveries_of", watched)
        assert len(claim(backend, "jobs", 10)) == 3
        assert lock_free == [True]
    finally:
        backend.close()
