"""The SQLite pool hands each connection to one thread at a time, never holds more than
``pool_size``, reuses the connection given back last, and closes every connection."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from sqlbroker.core.errors import InvalidOption, StorageError
from sqlbroker.storage.sqlite.connection import SqlitePool


def pool(tmp_path: Path, size: int) -> SqlitePool:
    return SqlitePool(str(tmp_path / "pool.db"), synchronous="full", busy_timeout=5, pool_size=size)


def test_threads_wait_for_a_slot_of_a_small_pool(tmp_path: Path) -> None:
    db = pool(tmp_path, 2)
    lock = threading.Lock()
    held: set[int] = set()
    seen: set[int] = set()
    most = 0
    failures: list[BaseException] = []

    def work() -> None:
        nonlocal most
        try:
            for _ in range(40):
                with db.connection() as conn:
                    with lock:
                        assert id(conn) not in held, "a connection handed to two threads"
                        held.add(id(conn))
                        seen.add(id(conn))
                        most = max(most, len(held))
                    conn.execute("SELECT 1").fetchall()
                    with lock:
                        held.discard(id(conn))
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    db.close()
    assert failures == []
    assert most <= 2
    assert len(seen) <= 2


def test_one_thread_reuses_the_connection_given_back_last(tmp_path: Path) -> None:
    db = pool(tmp_path, 4)
    with db.connection() as first, db.connection() as second:
        assert first is not second
    with db.connection() as again:
        assert again is first  # given back last: its page cache is the warmest
    db.close()


def test_close_closes_idle_connections_and_those_given_back_after(tmp_path: Path) -> None:
    db = pool(tmp_path, 2)
    with db.connection() as busy, db.connection() as idle:
        pass  # idle given back first, busy last
    with db.connection() as again:
        assert again is busy
        db.close()
        with pytest.raises(sqlite3.ProgrammingError):
            idle.execute("SELECT 1")
        busy.execute("SELECT 1")
    with pytest.raises(sqlite3.ProgrammingError):
        busy.execute("SELECT 1")
    with pytest.raises(StorageError, match="closed"), db.connection():
        pass


def test_a_failed_statement_is_translated_and_the_connection_kept(tmp_path: Path) -> None:
    db = pool(tmp_path, 1)
    with db.connection() as conn:
        pass
    with pytest.raises(StorageError, match="SQLite error"), db.connection() as same:
        same.execute("SELECT * FROM nowhere_at_all(")
    with db.connection() as after:
        assert after is conn
    db.close()


@pytest.mark.parametrize("name", ["a\x00b.db", "a\nb.db", "a\ud800b.db"])
def test_a_path_of_no_printable_utf8_text_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        SqlitePool(str(tmp_path / name), synchronous="full", busy_timeout=5, pool_size=1)
    assert caught.value.field == "url"
    assert list(tmp_path.iterdir()) == []
