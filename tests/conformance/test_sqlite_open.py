"""SQLite only: connections opened together on a new database file never fail, and a
locked database is reported for what it was.

``PRAGMA journal_mode = WAL`` on a new connection can get SQLITE_BUSY at once, without the
busy handler, while another connection opens the same new file: a worker starting beside
its producers raised ``DatabaseBusy`` (then worded "stayed locked for more than 30 s")
within a second, about one start in ten. The open now waits for it like for any lock."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

import sqlbroker


def test_brokers_opening_a_new_file_together_all_work(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    rounds = 120

    for round_ in range(rounds):
        url = f"sqlite:///{tmp_path / f'new{round_}.db'}"
        first = sqlbroker.Broker(url, migrate=True)

        def read(broker: sqlbroker.Broker = first) -> None:
            try:
                broker.pending("jobs")
            except BaseException as error:
                errors.append(error)

        # Two reads at once: at least one opens a connection of its own.
        readers = [threading.Thread(target=read) for _ in range(2)]
        for reader in readers:
            reader.start()
        try:
            with sqlbroker.Broker(url, migrate=True) as second:
                second.send("jobs", {"round": round_})
        except BaseException as error:
            errors.append(error)
        for reader in readers:
            reader.join()
        first.close()
    assert not errors, errors[:3]


def test_a_lock_held_past_the_busy_timeout_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    with sqlbroker.Broker(url, migrate=True, busy_timeout=0.2) as broker:
        holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            with pytest.raises(
                sqlbroker.DatabaseBusy, match=r"stayed locked for the whole busy timeout \(0\.2 s\)"
            ):
                broker.send("jobs", {"n": 1})
        finally:
            holder.close()
        assert broker.pending("jobs") == []
