"""How durable a claim's commit is (PostgreSQL; SQLite in ``test_claim_commit_sqlite.py``).

By default a claim commits with ``synchronous_commit`` off for its own transaction: it
does not wait for the WAL to be written, as a server crash can forget only the lease
(``tests/reliability/test_claim_commit_crash.py``). ``durable_claims=True`` makes the claim
wait like every other write. The setting must never outlive the claim's transaction: a
publish on the same pooled connection afterwards stays durable.

A commit that waits writes the WAL itself (``pg_stat_wal.wal_write`` counts the writes,
with or without ``fsync``); one that does not leaves the WAL to the WAL writer, which
writes it in a few batches a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import sqlbroker
from sqlbroker.core.errors import InvalidOption

pytestmark = pytest.mark.postgres

CLAIMS = 40


def wal_writes(broker: sqlbroker.Broker) -> int:
    """The cluster's WAL writes so far, this session's pending counts included: the session
    flushes its statistics as it goes idle after ``pg_stat_force_next_flush()``."""
    with broker.backend.begin() as conn_tx:
        conn = conn_tx.connection
        conn.execute("SELECT pg_stat_force_next_flush()")
    with broker.backend.begin() as conn_tx:
        conn = conn_tx.connection
        row = conn.execute("SELECT wal_write FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


def writes_per_claims(broker: sqlbroker.Broker, claim: Callable[[], object]) -> int:
    broker.send_many("q", [{"i": i} for i in range(CLAIMS)])
    before = wal_writes(broker)
    for _ in range(CLAIMS):
        claim()
    return wal_writes(broker) - before


def claim_one(broker: sqlbroker.Broker) -> Callable[[], object]:
    def run() -> object:
        (delivery,) = broker.claim("q", limit=1)
        return delivery

    return run


def claim_one_on_loop(
    broker: sqlbroker.Broker, loop: asyncio.AbstractEventLoop
) -> Callable[[], object]:
    def run() -> object:
        (delivery,) = loop.run_until_complete(
            broker.backend.async_ops.message_claim_many(
                subscription="q", limit=1, lease=30.0, worker="loop"
            )
        )
        return delivery

    return run


def test_a_claim_does_not_wait_for_the_wal_by_default(pg_url: str) -> None:
    with sqlbroker.Broker(pg_url, pool_size=1) as broker:
        writes = writes_per_claims(broker, claim_one(broker))
    # Every waiting commit would write at least once; the WAL writer batches them instead.
    assert writes <= CLAIMS // 2, f"{writes} WAL writes for {CLAIMS} claims"


def test_the_worker_s_claim_on_its_loop_does_not_wait_either(pg_url: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        with sqlbroker.Broker(pg_url, pool_size=1) as broker:
            writes = writes_per_claims(broker, claim_one_on_loop(broker, loop))
            loop.run_until_complete(broker.backend.close_async())
    finally:
        loop.close()
    assert writes <= CLAIMS // 2, f"{writes} WAL writes for {CLAIMS} claims"


def test_durable_claims_wait_for_the_wal(pg_url: str) -> None:
    with sqlbroker.Broker(pg_url, pool_size=1, durable_claims=True) as broker:
        writes = writes_per_claims(broker, claim_one(broker))
    assert writes >= CLAIMS, f"{writes} WAL writes for {CLAIMS} claims"


def test_a_publish_after_a_claim_on_the_same_connection_is_durable(pg_url: str) -> None:
    with sqlbroker.Broker(pg_url, pool_size=1) as broker:
        broker.send_many("q", [{"i": i} for i in range(CLAIMS)])
        before = wal_writes(broker)
        for i in range(CLAIMS):
            assert len(broker.claim("q", limit=1)) == 1
            broker.send("other", {"i": i})
        writes = wal_writes(broker) - before
        with broker.backend.begin() as conn_tx:
            conn = conn_tx.connection
            row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row == ("on",)
    assert writes >= CLAIMS, f"{writes} WAL writes for {CLAIMS} publishes after claims"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_durable_claims_takes_a_bool_on_both_backends(
    pg_url: str, tmp_path: object, value: object
) -> None:
    for url in (pg_url, f"sqlite:///{tmp_path}/x.db"):
        with pytest.raises(InvalidOption, match=r"durable_claims.*True or False"):
            sqlbroker.Broker(url, durable_claims=value)
