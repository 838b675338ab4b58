"""The worker's claim and plain complete on PostgreSQL's async pool go straight through
libpq (dialect.direct), as a single send does: they return what the cursor path returns,
a driver error reaches the caller as a sqlbroker error, a cancelled claim is stopped on
the server, and behind a transaction pooler nothing is prepared."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import DatabaseBusy
from sqlbroker.core.message import Delivery
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.storage.base import DeadFilter
from sqlbroker.storage.factory import open_backend

from .support import cancel_while_locked, new_message, publish

LEASE = 30.0
# On a test clock that stands still, only a subscription's first claim promotes its delayed
# copies (a statement sent ahead of the claim, through the cursor): the later ones go direct.


def _variants(queue: str) -> list[Any]:
    at = datetime(2020, 1, 1, tzinfo=UTC)
    base = new_message(queue, {"n": 0})
    return [
        base,
        dataclasses.replace(new_message(queue, {"n": 1}), priority=7, headers='{"a": "b"}'),
        dataclasses.replace(
            new_message(queue), payload=b"raw bytes", content_type="text/plain", ordering_key="k"
        ),
        dataclasses.replace(
            new_message(queue, [1, 2]), available_at=at, expires_at=at + timedelta(days=36500)
        ),
        dataclasses.replace(new_message(queue, "text"), max_attempts=1),
    ]


def _comparable(delivery: Delivery) -> tuple[Any, ...]:
    """What a claim hands out, less what differs between two claims of equal messages."""
    return (
        delivery.subscription == delivery.topic,
        delivery.payload,
        delivery.content_type,
        delivery.headers,
        delivery.priority,
        delivery.key,
        delivery.idempotency_key,
        delivery.attempt,
        delivery.max_attempts,
        delivery.replay_count,
        delivery.expires_at and delivery.expires_at - delivery.available_at,
        delivery.lease_expires_at > delivery.available_at,
    )


def _prepared(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'sqlbroker%'"
        ).fetchall()
    return [row[0] for row in rows]


def test_a_direct_claim_and_complete_return_what_the_cursor_returns(pg_url: str) -> None:
    backend = open_backend(pg_url, pool_size=1, clock=ManualClock())
    try:
        for queue in ("sync", "direct"):
            publish(backend, queue)
            for message in _variants(queue):
                backend.message_insert_many(messages=[message], subscription=queue)
        sync = [
            *backend.message_claim_many(subscription="sync", limit=1, lease=LEASE, worker="w"),
            *backend.message_claim_many(subscription="sync", limit=10, lease=LEASE, worker="w"),
        ]

        async def scenario() -> tuple[list[Delivery], list[int], list[int], list[str]]:
            ops = backend.async_ops
            claimed: list[Delivery] = []
            for limit in (1, 10):
                claimed += await ops.message_claim_many(
                    subscription="direct", limit=limit, lease=LEASE, worker="w"
                )
            stale = Settlement.complete(Lease(claimed[0].id, "not-the-token"))
            refused: list[int] = await ops.message_settle_many(settlements=[stale])
            done: list[int] = await ops.message_settle_many(
                settlements=[Settlement.complete(d) for d in claimed]
            )
            async with backend.begin_async() as tx:  # the same (only) connection
                cursor = await tx.connection.execute(
                    "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'sqlbroker%'"
                )
                prepared = [row[0] for row in await cursor.fetchall()]
            return claimed, refused, done, prepared

        claimed, refused, done, prepared = asyncio.run(scenario())
        assert [_comparable(d) for d in claimed] == [_comparable(d) for d in sync]
        assert len(claimed) == 6
        assert refused == []
        assert done == sorted(d.id for d in claimed)
        # Both went direct: prepared by dialect.direct, not by psycopg's cursor (_pg3_*).
        assert any("SKIP LOCKED" in text for text in prepared)
        assert any("INSERT INTO sqlbroker_archive" in text for text in prepared)
        with psycopg.connect(pg_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM sqlbroker_archive WHERE subscription = 'direct'"
            ).fetchone()
        assert row == (6,)
    finally:
        backend.close()


def test_a_direct_claim_error_is_a_sqlbroker_error_and_the_pool_goes_on(
    pg_url: str, pg_server: Any
) -> None:
    backend = open_backend(pg_url, lock_timeout=0.2, clock=ManualClock())
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    try:
        publish(backend, "jobs", 3)

        async def scenario() -> tuple[BaseException | None, list[Delivery]]:
            claim = backend.async_ops.message_claim_many
            await claim(subscription="jobs", limit=1, lease=LEASE, worker="w")  # prepared
            refused = None
            with psycopg.connect(admin_url) as admin:
                admin.execute("LOCK TABLE sqlbroker_message IN EXCLUSIVE MODE")
                try:
                    await claim(subscription="jobs", limit=1, lease=LEASE, worker="w")
                except BaseException as error:
                    refused = error
            after = await claim(subscription="jobs", limit=5, lease=LEASE, worker="w")
            return refused, after

        refused, after = asyncio.run(scenario())
        assert isinstance(refused, DatabaseBusy)
        assert not isinstance(refused, psycopg.Error)
        assert len(after) == 2
    finally:
        backend.close()


def test_a_cancelled_direct_claim_is_stopped_on_the_server(pg_url: str, pg_server: Any) -> None:
    # Timeouts far past the wait below: only the cancel request can end the statement.
    backend = open_backend(
        pg_url,
        lock_timeout=600,
        statement_timeout=1200,
        network_timeout=1800,
        clock=ManualClock(),
    )
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    try:
        publish(backend, "jobs", 3)

        async def scenario() -> list[Delivery]:
            claim = backend.async_ops.message_claim_many
            await claim(subscription="jobs", limit=1, lease=LEASE, worker="w")  # prepared
            await cancel_while_locked(
                admin_url, lambda: claim(subscription="jobs", limit=1, lease=LEASE, worker="w")
            )
            return list(await claim(subscription="jobs", limit=5, lease=LEASE, worker="w"))

        # The cancelled claim leased nothing: both copies it did not take are claimable.
        assert len(asyncio.run(scenario())) == 2
    finally:
        backend.close()


@pytest.mark.parametrize("pooler", [None, "transaction"])
def test_behind_a_transaction_pooler_a_claim_prepares_nothing(
    pg_url: str, pooler: str | None
) -> None:
    backend = open_backend(pg_url, pooler=pooler, pool_size=1, clock=ManualClock())
    try:
        publish(backend, "jobs", 4)

        async def scenario() -> list[str]:
            ops = backend.async_ops
            for _ in range(2):
                claimed = await ops.message_claim_many(
                    subscription="jobs", limit=2, lease=LEASE, worker="w"
                )
                await ops.message_settle_many(settlements=[Settlement.complete(d) for d in claimed])
            async with backend.begin_async() as tx:  # the same (only) connection
                cursor = await tx.connection.execute(
                    "SELECT name FROM pg_prepared_statements WHERE name LIKE 'sqlbroker%'"
                )
                return [row[0] for row in await cursor.fetchall()]

        names = asyncio.run(scenario())
        assert names == [] if pooler else len(names) == 2
    finally:
        backend.close()


def test_a_direct_claim_dead_letters_a_row_with_infinite_times(pg_url: str, pg_server: Any) -> None:
    """The direct claim loads times with psycopg's own loader, which refuses ``infinity``
    (adapters.Strict): a copy holding one (raw SQL) is damage, dead-lettered, and the claim
    hands out the rest, as the cursor path does."""
    backend = open_backend(pg_url, pool_size=1, clock=ManualClock())
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    try:
        publish(backend, "jobs", 3)

        async def scenario() -> tuple[list[Delivery], list[str]]:
            claim = backend.async_ops.message_claim_many
            await claim(subscription="jobs", limit=1, lease=LEASE, worker="w")  # prepared
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(
                    "UPDATE sqlbroker_message SET expires_at = 'infinity',"
                    " available_at = '-infinity' WHERE id = (SELECT min(id) FROM"
                    " sqlbroker_message WHERE state = 'available')"
                )
            claimed = list(await claim(subscription="jobs", limit=5, lease=LEASE, worker="w"))
            async with backend.begin_async() as tx:  # the same (only) connection
                cursor = await tx.connection.execute(
                    "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'sqlbroker%'"
                )
                return claimed, [row[0] for row in await cursor.fetchall()]

        (delivery,), prepared = asyncio.run(scenario())
        assert delivery.payload == {"n": 2}
        assert any("SKIP LOCKED" in text for text in prepared)  # the claims went direct
        (dead,) = backend.dead_list(where=DeadFilter(), limit=10, after_id=None)
        infinite = "is infinity, not a time"
        assert dead.reason == f"undecodable: available_at {infinite}; expires_at {infinite}"
    finally:
        backend.close()
