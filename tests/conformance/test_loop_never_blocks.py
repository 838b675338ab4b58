"""The backend's coroutines (the worker's claim, ``begin_async`` and the ack inside
it) never block the event loop on the database, and do not use the loop's default
executor, which user code shares."""

from __future__ import annotations

import asyncio
import threading

import sqlbroker
from helpers import RefusingExecutor, claim_one
from sqlbroker.core.settlements import Lease, Settlement


def test_async_operations_keep_off_the_default_executor(broker: sqlbroker.Broker) -> None:
    backend = broker.backend
    broker.send("q", "a")
    broker.send("q", "b")

    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(RefusingExecutor())
        try:
            (claimed,) = await backend.async_ops.message_claim_many(
                subscription="q", limit=1, lease=60, worker="loop"
            )
            async with backend.begin_async() as tx:
                return await tx.message_settle_many(
                    settlements=[Settlement.complete(Lease.of(claimed))]
                )
        finally:
            await backend.close_async()

    (completed,) = asyncio.run(scenario())
    assert [a.id for a in broker.archive("q")] == [completed]
    assert claim_one(broker, "q").payload == "b"


def test_a_transaction_waiting_for_the_database_leaves_the_loop_running(
    broker: sqlbroker.Broker,
) -> None:
    """Another thread holds a write transaction until the loop itself says so: had the
    coroutine waiting for the database blocked the loop, that word would never come (and
    SQLite's wait would end in ``DatabaseBusy``)."""
    backend = broker.backend
    broker.send("q", 1)
    delivery = claim_one(broker, "q")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with backend.begin():
            holding.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)

    async def acknowledge() -> list[int]:
        async with backend.begin_async() as tx:
            return await tx.message_settle_many(
                settlements=[Settlement.complete(Lease.of(delivery))]
            )

    async def scenario() -> list[int]:
        try:
            task = asyncio.create_task(acknowledge())
            await asyncio.sleep(0)  # the task starts waiting for the write lock
            release.set()
            return await task
        finally:
            await backend.close_async()

    try:
        assert asyncio.run(scenario()) == [delivery.id]
    finally:
        release.set()
        holder.join()
    assert [a.message_id for a in broker.archive("q")] == [delivery.message_id]
