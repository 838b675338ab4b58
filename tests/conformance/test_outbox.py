"""Transactional publish (the outbox): with ``conn=`` the message is written in the caller's
open transaction, which the caller commits or rolls back; sqlbroker never commits it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

import sqlbroker
from helpers import table_counts


class CallerConnection:
    """The application's own connection to the broker's database."""

    def __init__(self, backend_url: str) -> None:
        self.conn: Any
        if backend_url.startswith("sqlite"):
            self.conn = sqlite3.connect(
                backend_url.removeprefix("sqlite:///"), isolation_level=None
            )
        else:
            import psycopg

            self.conn = psycopg.connect(backend_url)

    def begin(self) -> Any:
        """Open a transaction that has already written (as an application's would have)."""
        if isinstance(self.conn, sqlite3.Connection):
            self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS app_orders (id integer)")
        self.conn.execute("INSERT INTO app_orders VALUES (1)")
        return self.conn

    def commit(self) -> None:
        if isinstance(self.conn, sqlite3.Connection):
            self.conn.execute("COMMIT")
        else:
            self.conn.commit()

    def rollback(self) -> None:
        if isinstance(self.conn, sqlite3.Connection):
            self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()


@pytest.fixture
def outbox(
    make_broker: Any, backend_url: str
) -> Iterator[tuple[sqlbroker.Broker, CallerConnection]]:
    # On SQLite a write of the broker's own while the caller's transaction holds the write
    # lock would wait for the busy timeout: keep that short so such a bug fails fast.
    options = {"busy_timeout": 2} if backend_url.startswith("sqlite") else {}
    broker = make_broker(**options)
    broker.stats()  # the schema exists before the caller's connection uses it
    caller = CallerConnection(backend_url)
    try:
        yield broker, caller
    finally:
        caller.conn.close()


def test_publish_with_conn_commits_with_the_caller(
    outbox: tuple[sqlbroker.Broker, CallerConnection],
) -> None:
    broker, caller = outbox
    broker.subscribe("sub", "orders.*")
    conn = caller.begin()
    message_id = broker.publish("orders.created", {"id": 1}, conn=conn)
    ids = broker.publish_many([{"topic": "orders.paid", "payload": 2}], conn=conn)
    caller.commit()
    assert [d.message_id for d in broker.claim("sub", limit=10)] == [message_id, *ids]


def test_publish_with_conn_rolls_back_with_the_caller(
    outbox: tuple[sqlbroker.Broker, CallerConnection],
) -> None:
    broker, caller = outbox
    broker.subscribe("sub", "orders.*")
    before = table_counts(broker.backend)
    conn = caller.begin()
    broker.publish("orders.created", {"id": 1}, conn=conn)
    broker.publish("nobody", {"id": 2}, conn=conn)
    broker.publish("orders.created", {"id": 3}, idempotency_key="k", conn=conn)
    caller.rollback()
    assert table_counts(broker.backend) == before
    assert broker.claim("sub", limit=10) == []


def test_send_with_conn_commits(outbox: tuple[sqlbroker.Broker, CallerConnection]) -> None:
    broker, caller = outbox
    sent = broker.send("emails", "hello", conn=caller.begin())
    caller.commit()
    (delivery,) = broker.claim("emails")
    assert delivery.message_id == sent


def test_send_with_conn_rolls_back_everything(
    outbox: tuple[sqlbroker.Broker, CallerConnection],
) -> None:
    """Nothing of a rolled-back send survives, not even the queue it would have created."""
    broker, caller = outbox
    before = table_counts(broker.backend)
    conn = caller.begin()
    broker.send("emails", {"to": "a@example.com"}, conn=conn)
    broker.send_many("emails", [1, 2], conn=conn)
    caller.rollback()
    assert table_counts(broker.backend) == before
    assert broker.subscriptions() == []


def test_wrong_connection_type_is_refused(broker: sqlbroker.Broker) -> None:
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.ValidationError) as caught:
        broker.publish("t", 1, conn=object())
    assert caught.value.field == "conn"
    assert table_counts(broker.backend) == before


def test_publish_listeners_stay_silent_until_the_caller_commits(
    outbox: tuple[sqlbroker.Broker, CallerConnection],
) -> None:
    """A wake-up before the caller's commit would find nothing; NOTIFY (PostgreSQL) or the
    change watcher (SQLite) tells workers once the caller commits."""
    broker, caller = outbox
    heard: list[str | None] = []
    broker.add_publish_listener(heard.append)
    conn = caller.begin()
    broker.send("emails", "hello", conn=conn)
    broker.publish("orders.created", {"id": 1}, conn=conn)
    caller.commit()
    assert heard == []


def test_a_queue_created_in_a_rolled_back_transaction_is_not_taken_as_existing(
    make_broker: Any, backend_url: str
) -> None:
    """A send that created its queue in the caller's transaction, rolled back, leaves no
    belief behind that the queue exists: the next send creates it again, with the check
    of the limits a queue's creation makes."""
    options = {"busy_timeout": 2} if backend_url.startswith("sqlite") else {}
    broker = make_broker(max_subscriptions=2, **options)
    broker.subscribe("kept", "orders.*")
    caller = CallerConnection(backend_url)
    try:
        conn = caller.begin()
        broker.send("fresh", 1, conn=conn)
        broker.send("fresh", 2, conn=conn)  # the queue now exists, in this transaction only
        caller.rollback()
    finally:
        caller.conn.close()
    assert sorted(s.name for s in broker.subscriptions()) == ["kept"]
    broker.send("other", 1)
    with pytest.raises(sqlbroker.LimitExceeded, match="max_subscriptions"):
        broker.send("fresh", 3)
    assert sorted(s.name for s in broker.subscriptions()) == ["kept", "other"]
    broker.unsubscribe("other")
    broker.send("fresh", 4)
    assert [d.payload for d in broker.claim("fresh", limit=10)] == [4]
