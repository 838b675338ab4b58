"""SQLite's ``SQLITE_FULL`` without a full disk: ``PRAGMA max_page_count`` on a caller's
connection makes SQLite answer as a full disk does, so this runs anywhere (the scenarios
that fill real disks under both backends, which need root to mount a tmpfs, are in
``tests/reliability/test_full_disk.py``)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

import sqlbroker


def test_a_full_sqlite_database_raises_storage_full_and_keeps_no_row_of_the_batch(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broker.db"
    with sqlbroker.Broker(f"sqlite:///{path}") as broker:
        broker.send("jobs", {"n": 0})
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
            conn.execute("BEGIN")
            with pytest.raises(sqlbroker.StorageFull) as raised:
                broker.publish_many(
                    (
                        {"topic": "jobs", "payload": {"n": n, "pad": "x" * 20_000}}
                        for n in range(10)
                    ),
                    conn=conn,
                )
            conn.rollback()
        finally:
            conn.close()
        assert isinstance(raised.value, sqlbroker.StorageError)
        assert str(raised.value) == (
            "the SQLite database's disk is full; nothing was written, try again once space"
            " is freed (database or disk is full)"
        )
        assert (raised.value.backend, raised.value.detail) == ("SQLite", "database or disk is full")
        assert len(broker.pending("jobs")) == 1
    with sqlite3.connect(path) as check:
        rows = check.execute(
            "SELECT (SELECT count(*) FROM sqlbroker_message)"
            " + (SELECT count(*) FROM sqlbroker_archive)"
        ).fetchone()[0]
    check.close()
    assert rows == 1  # the first send alone: none of the refused batch


def test_a_complete_in_a_callers_transaction_on_a_full_sqlite_database_writes_nothing(
    tmp_path: Path,
) -> None:
    """The archive's insert runs without a statement journal (``OR FAIL``): on a full
    database it still raises ``StorageFull`` and the copy stays leased, neither archived
    nor deleted (the caller's transaction rolls back)."""
    path = tmp_path / "broker.db"
    with sqlbroker.Broker(f"sqlite:///{path}") as broker:
        broker.send("jobs", {"pad": "x" * 40_000})
        [delivery] = broker.claim("jobs", lease=60)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("VACUUM")  # no free pages left for the archive's copy
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
            conn.execute("BEGIN")
            with pytest.raises(sqlbroker.StorageFull):
                broker.complete(delivery, conn=conn)
            if conn.in_transaction:
                conn.rollback()
        finally:
            conn.close()
        broker.complete(delivery)  # the lease still holds: space is back (no page cap)
    with sqlite3.connect(path) as check:
        counts = check.execute(
            "SELECT (SELECT count(*) FROM sqlbroker_message),"
            " (SELECT count(*) FROM sqlbroker_archive)"
        ).fetchone()
    check.close()
    assert counts == (0, 1)  # completed once, by the second complete


def test_a_claim_whose_dead_letter_finds_the_sqlite_database_full_says_it_may_be_partly_done(
    tmp_path: Path,
) -> None:
    """A SQLite claim commits its leases before it decodes its rows, and dead-letters the
    rows that do not decode in a transaction of its own. When that one finds the database
    full, the claim's leases stand: ``StorageFull`` says the operation may be partly done,
    not that nothing was written (which it used to say), and that what was done is not
    done twice by trying again — true of a claim: its leased copies are not claimed again
    before their leases expire (it used to advise trying again, without saying so)."""
    path = tmp_path / "broker.db"
    with sqlbroker.Broker(f"sqlite:///{path}", pool_size=1) as broker:
        for _ in range(100):
            broker.send("jobs", {"pad": "x" * 300})
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("UPDATE sqlbroker_message SET headers = '[1]'")
            conn.execute("VACUUM")
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
        # Room for the claim's leases (2 pages do), none for 100 dead letters.
        with broker._backend._db.write() as own:  # the backend's one connection
            own.execute(f"PRAGMA max_page_count = {pages + 6}")
        with pytest.raises(sqlbroker.StorageFull) as raised:
            broker.claim("jobs", lease=60, limit=100)
        assert "nothing was written" not in str(raised.value)
        assert "statements before it had committed on their own" in str(raised.value)
        assert str(raised.value).endswith(
            "so it may be partly done: what they did stands, and is not done twice by trying"
            " again once space is freed (database or disk is full)"
        )
        assert {p.state.value for p in broker.pending("jobs")} == {"running"}
        assert broker.dead_letters.list() == []
        with broker._backend._db.write() as own:
            own.execute("PRAGMA max_page_count = 1073741823")
        assert broker.claim("jobs", lease=60, limit=100) == []
        assert len(broker.pending("jobs")) == 100
