"""The outbox as a new user meets it: the broker's very first use is a publish inside the
caller's open transaction, on a database file that did not exist a moment ago."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlbroker


def test_the_readme_outbox_on_a_fresh_sqlite_file(tmp_path: Path) -> None:
    """README's pattern, literally: ``with db:`` (sqlite3's implicit transaction), the
    application's INSERT takes the write lock, then the publish joins that transaction.
    A schema created on first use would wait for that lock for the whole busy timeout."""
    path = tmp_path / "app.db"
    broker = sqlbroker.Broker(f"sqlite:///{path}")
    db = sqlite3.connect(path)
    try:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        db.commit()
        with db:
            db.execute("INSERT INTO orders (id) VALUES (42)")
            message_id = broker.publish("orders.created", {"order": 42}, conn=db)
            assert db.in_transaction, "the publish must not commit the caller's transaction"
        assert [a.message_id for a in broker.archive(outcome="unrouted")] == [message_id]
    finally:
        db.close()
        broker.close()


def test_a_rolled_back_first_publish_leaves_no_message(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    db.commit()
    broker = sqlbroker.Broker(f"sqlite:///{path}")
    try:
        db.execute("INSERT INTO orders (id) VALUES (1)")
        broker.publish("orders.created", {"order": 1}, conn=db)
        db.rollback()
        assert broker.archive() == []
        assert db.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    finally:
        db.close()
        broker.close()
