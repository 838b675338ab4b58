"""Stuck transactions and lock timeouts on PostgreSQL (issue 25, part 7).

Another session holds a lock sqlbroker's statement needs (a whole table, a message row, a
subscription row, an ordering key's advisory lock) and stays idle in its transaction. The
statement must fail by itself, within ``lock_timeout``, with sqlbroker's ``DatabaseBusy``
(nothing changed, safe to try again), never hang or leak a driver error; work the lock does
not cover goes on; once the lock is gone the same call succeeds and nothing is lost. A
handler's own transaction (``backend.begin(timed=False)``, what ``msg.transaction()`` opens) is
held to neither timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import psycopg
import pytest

import sqlbroker

pytestmark = pytest.mark.postgres

# Short timeouts so the test is quick, far below network_timeout so the watchdog (which
# would cut the connection and leave the outcome unknown) never has to act.
LOCK_TIMEOUT = 0.3
NETWORK_TIMEOUT = 20


@pytest.fixture
def broker(pg_url: str) -> Iterator[sqlbroker.Broker]:
    with sqlbroker.Broker(
        pg_url, lock_timeout=LOCK_TIMEOUT, network_timeout=NETWORK_TIMEOUT
    ) as opened:
        yield opened


@pytest.fixture
def holder(pg_url: str) -> Iterator[psycopg.Connection]:
    """A raw session whose transaction stays open (idle in transaction) until rolled back."""
    with psycopg.connect(pg_url) as conn:
        yield conn


def _count(url: str, statement: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(statement.encode()).fetchone()
    assert row is not None
    return int(row[0])


def test_a_table_lock_held_elsewhere_fails_publish_claim_and_complete_then_they_succeed(
    broker: sqlbroker.Broker, holder: psycopg.Connection, pg_url: str
) -> None:
    broker.send("jobs", {"n": 0})
    (claimed,) = broker.claim("jobs", lease=60)
    holder.execute("LOCK TABLE sqlbroker_message IN ACCESS EXCLUSIVE MODE")

    with pytest.raises(sqlbroker.DatabaseBusy, match="lock_timeout") as publish_failed:
        broker.send("jobs", {"n": 1}, idempotency_key="one")
    with pytest.raises(sqlbroker.DatabaseBusy, match="lock_timeout"):
        broker.claim("jobs", lease=60)
    with pytest.raises(sqlbroker.DatabaseBusy, match="lock_timeout"):
        broker.complete(claimed)
    assert "nothing was changed" in str(publish_failed.value)

    holder.rollback()
    broker.send("jobs", {"n": 1}, idempotency_key="one")
    broker.complete(claimed)
    (second,) = broker.claim("jobs", lease=60)
    assert second.payload == {"n": 1}
    broker.complete(second)
    # Nothing lost, nothing twice: two messages, both completed once.
    assert _count(pg_url, "SELECT count(*) FROM sqlbroker_message") == 0
    assert _count(pg_url, "SELECT count(*) FROM sqlbroker_archive") == 2


def test_a_row_lock_held_elsewhere_fails_only_what_needs_that_row(
    broker: sqlbroker.Broker, holder: psycopg.Connection, pg_url: str
) -> None:
    """A message row locked by an idle transaction: its ack fails, the claim of the other
    messages (SKIP LOCKED) and other subscriptions' work do not wait."""
    broker.send("jobs", {"n": 0})
    broker.send("jobs", {"n": 1})
    broker.send("other", {"n": 2})
    (first,) = broker.claim("jobs", lease=60)
    holder.execute("SELECT 1 FROM sqlbroker_message WHERE id = %s FOR UPDATE", (first.id,))

    with pytest.raises(sqlbroker.DatabaseBusy, match="lock_timeout"):
        broker.complete(first)
    (second,) = broker.claim("jobs", lease=60)
    (other,) = broker.claim("other", lease=60)
    broker.complete(second)
    broker.complete(other)

    holder.rollback()
    broker.complete(first)
    assert _count(pg_url, "SELECT count(*) FROM sqlbroker_message") == 0
    assert _count(pg_url, "SELECT count(*) FROM sqlbroker_archive") == 3


def test_a_subscription_row_lock_held_elsewhere_stalls_no_other_subscription(
    broker: sqlbroker.Broker, holder: psycopg.Connection, pg_url: str
) -> None:
    broker.subscribe("held", ["held.#"])
    broker.subscribe("free", ["free.#"])
    broker.publish("free.a", {"n": 0})
    holder.execute("SELECT 1 FROM sqlbroker_subscription WHERE name = 'held' FOR UPDATE")

    with pytest.raises(sqlbroker.DatabaseBusy, match="lock_timeout"):
        broker.unsubscribe("held")
    broker.publish("free.a", {"n": 1})
    assert len(broker.claim("free", limit=10, lease=60)) == 2

    holder.rollback()
    assert broker.unsubscribe("held")


def test_an_ordering_key_held_by_a_callers_open_transaction(
    broker: sqlbroker.Broker, pg_url: str
) -> None:
    """A caller publishing key K inside its own transaction holds K's lock until it ends:
    another publish of K fails within lock_timeout, other keys and claims go on. (The queue
    exists first: a queue created inside the caller's transaction is an uncommitted row
    that every other publish to it waits for.)"""
    broker.send("jobs", {"n": -1})
    broker.complete(broker.claim("jobs", lease=60)[0])
    with psycopg.connect(pg_url) as caller:
        broker.send("jobs", {"n": 0}, key="K", conn=caller)
        with pytest.raises(sqlbroker.DatabaseBusy, match="lock_timeout"):
            broker.send("jobs", {"n": 1}, key="K", idempotency_key="k1")
        broker.send("jobs", {"n": 2}, key="J")
        (j,) = broker.claim("jobs", lease=60)
        assert j.payload == {"n": 2}
        broker.complete(j)
        caller.commit()
    broker.send("jobs", {"n": 1}, key="K", idempotency_key="k1")
    done = []
    while found := broker.claim("jobs", lease=60):
        for delivery in found:
            done.append(delivery.payload["n"])
            broker.complete(delivery)
    assert done == [0, 1]


def test_statement_timeout_gives_database_busy(pg_url: str, holder: psycopg.Connection) -> None:
    with sqlbroker.Broker(
        pg_url, lock_timeout=0, statement_timeout=LOCK_TIMEOUT, network_timeout=NETWORK_TIMEOUT
    ) as broker:
        holder.execute("LOCK TABLE sqlbroker_message IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(sqlbroker.DatabaseBusy, match="statement_timeout"):
            broker.send("jobs", {"n": 0})
        holder.rollback()
        broker.send("jobs", {"n": 0})


def test_handler_transactions_are_not_held_to_the_timeouts(
    pg_url: str, holder: psycopg.Connection
) -> None:
    """What ``msg.transaction()`` opens may wait for locks and run as long as it needs."""
    with sqlbroker.Broker(
        pg_url, lock_timeout=0.1, statement_timeout=0.2, network_timeout=NETWORK_TIMEOUT
    ) as broker:
        broker.send("jobs", {"n": 0})
        holder.execute("LOCK TABLE sqlbroker_message IN ACCESS EXCLUSIVE MODE")
        release = threading.Timer(0.6, holder.rollback)
        release.start()
        try:
            with broker.backend.begin(timed=False) as tx:
                tx.connection.execute("SELECT count(*) FROM sqlbroker_message")  # the lock
                tx.connection.execute("SELECT pg_sleep(0.3)")
        finally:
            release.join()

        async def in_a_handler() -> None:
            async with broker.backend.begin_async(timed=False) as tx:
                await tx.connection.execute("SELECT pg_sleep(0.3)")

        asyncio.run(in_a_handler())
        # The pooled connections keep the timeouts for sqlbroker's own statements.
        with psycopg.connect(pg_url) as other:
            other.execute("LOCK TABLE sqlbroker_message IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(sqlbroker.DatabaseBusy, match="lock_timeout"):
                broker.send("jobs", {"n": 1})


def test_timeouts_are_validated(pg_url: str) -> None:
    for bad in (-1, "1s", 3601):
        with pytest.raises(sqlbroker.ValidationError, match="lock_timeout"):
            sqlbroker.Broker(pg_url, lock_timeout=bad)
        with pytest.raises(sqlbroker.ValidationError, match="statement_timeout"):
            sqlbroker.Broker(pg_url, statement_timeout=bad)
