"""SQLite's ``SQLITE_FULL`` without a full disk: ``PRAGMA max_page_count`` on a caller's
connection makes SQLite answer as a full disk does, so this runs anywhere (the scenarios
that fill real disks under both backends, which need root to mount a tmpfs, are in
``tests/reliability/test_full_disk.py``)."""

from __future__ import annotations

import sqlite3
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
