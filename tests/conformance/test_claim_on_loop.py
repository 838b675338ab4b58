"""The worker's claim from its event loop (``async_ops.message_claim_many``): on PostgreSQL it
runs on the loop's own async connection, so it is held to the blocking claim's contract —
order, due delayed copies, expiry, the lease — and to its error translation."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import pytest

import sqlbroker
from helpers import assert_time, now_of
from pgserver import quote_literal
from sqlbroker.core.message import Delivery

LEASE = 45.0


def claim_on_loop(broker: sqlbroker.Broker, subscription: str, limit: int) -> list[Delivery]:
    async def claim() -> list[Delivery]:
        try:
            return await broker.backend.async_ops.message_claim_many(
                subscription=subscription, limit=limit, lease=LEASE, worker="loop"
            )
        finally:
            await broker.backend.close_async()

    return asyncio.run(claim())


def test_the_loop_claim_keeps_the_claim_contract(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    broker = clocked_broker
    now = now_of(clock)
    low = broker.send("q", "low", priority=5)
    urgent = broker.send("q", "urgent", priority=0)
    expires = broker.send("q", "expires", ttl=5)
    delayed = broker.send("q", "delayed", delay=10)
    later = broker.send("q", "later", delay=3600)
    clock.advance(timedelta(seconds=20))

    deliveries = claim_on_loop(broker, "q", limit=10)

    # The delayed copy became due while no claim ran: the loop's claim promotes it first.
    assert [d.message_id for d in deliveries] == [urgent, delayed, low]
    for delivery in deliveries:
        assert delivery.attempt == 1
        assert_time(delivery.lease_expires_at, now + timedelta(seconds=20 + LEASE))
    assert broker.claim("q", limit=10) == []
    broker.complete(deliveries)
    broker.reap()
    outcomes = {a.message_id: a.outcome for a in broker.archive("q")}
    assert outcomes == {
        urgent: sqlbroker.Outcome.COMPLETED,
        delayed: sqlbroker.Outcome.COMPLETED,
        low: sqlbroker.Outcome.COMPLETED,
        expires: sqlbroker.Outcome.EXPIRED,
    }
    assert [p.message_id for p in broker.pending("q")] == [later]


def test_the_loop_claim_respects_its_limit_and_the_subscription(broker: sqlbroker.Broker) -> None:
    broker.send_many("q", list(range(5)))
    broker.send("other", "not mine")
    first = claim_on_loop(broker, "q", limit=3)
    rest = claim_on_loop(broker, "q", limit=100)
    assert [d.payload for d in first + rest] == [0, 1, 2, 3, 4]
    assert claim_on_loop(broker, "nobody", limit=10) == []


@pytest.mark.postgres
def test_a_loop_claim_after_its_connection_was_terminated_does_not_fail(
    pg_url: str, pg_server: Any
) -> None:
    """The session of the loop's idle pooled connection is ended by the server (a restart,
    ``pg_terminate_backend``): nothing had been sent on it, so the next claim takes a live
    connection instead of failing (the pool's checkout looks at the socket first)."""
    app = "sqlbroker-loop-claim-under-test"
    dbname = unquote(urlsplit(pg_url).path.lstrip("/"))
    with sqlbroker.Broker(pg_url, application_name=app) as broker:
        broker.send_many("q", ["a", "b"])
        backend = broker.backend

        async def scenario() -> list[Delivery]:
            first = await backend.async_ops.message_claim_many(
                subscription="q", limit=1, lease=LEASE, worker="loop"
            )
            assert [d.payload for d in first] == ["a"]
            pg_server.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity"
                f" where datname = {quote_literal(dbname)}"
                f" and application_name = {quote_literal(app)}"
            )
            # pg_terminate_backend only signals: wait until the sessions have ended.
            for _ in range(600):
                with psycopg.connect(pg_url, autocommit=True) as probe:
                    left = probe.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        (app,),
                    ).fetchone()
                if left == (0,):
                    break
                await asyncio.sleep(0.05)
            try:
                return await backend.async_ops.message_claim_many(
                    subscription="q", limit=10, lease=LEASE, worker="loop"
                )
            finally:
                await backend.close_async()

        assert [d.payload for d in asyncio.run(scenario())] == ["b"]
