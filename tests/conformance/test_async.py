"""AsyncBroker: the same operations, awaitable (run with asyncio.run; no plugin needed)."""

from __future__ import annotations

import asyncio

import sqlbroker


def test_async_publish_claim_complete(backend_url: str) -> None:
    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            assert "AsyncBroker(" in repr(broker)
            await broker.subscribe("sub", "orders.*")
            published = await broker.publish("orders.created", {"n": 1}, headers={"h": "v"})
            sent = await broker.send_many("q", [1, 2, 3])
            assert len(sent) == 3
            deliveries = await broker.claim("sub", limit=10)
            assert [(d.message_id, d.payload, d.headers) for d in deliveries] == [
                (published, {"n": 1}, {"h": "v"})
            ]
            await broker.complete(deliveries)
            from_queue = await broker.claim("q", limit=10)
            assert [d.payload for d in from_queue] == [1, 2, 3]
            await broker.retry(from_queue[0], after=60)
            await broker.dead_letter(from_queue[1], reason="async dead")
            extended = await broker.extend(from_queue[2], lease=120)
            assert extended > from_queue[2].lease_expires_at
            await broker.release(from_queue[2])
            stats = {s.subscription: s for s in await broker.stats()}
            assert (stats["q"].ready, stats["q"].scheduled, stats["q"].dead) == (1, 1, 1)
            (dead,) = await broker.dead_letters.list()
            assert dead.reason == "async dead"
            assert await broker.dead_letters.replay([dead.id])
            archived = await broker.archive("sub")
            assert [(a.message_id, a.outcome) for a in archived] == [
                (published, sqlbroker.Outcome.COMPLETED)
            ]
            assert len(await broker.pending("q")) == 3

    asyncio.run(scenario())


def test_async_calls_run_concurrently(backend_url: str) -> None:
    async def scenario() -> list[str]:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            await broker.send("warmup", 0)
            ids = await asyncio.gather(*(broker.send("q", i) for i in range(20)))
            claimed = await asyncio.gather(*(broker.claim("q", limit=5) for _ in range(4)))
            flat = [d for batch in claimed for d in batch]
            assert sorted(d.payload for d in flat) == list(range(20))
            assert len({d.id for d in flat}) == 20
            await broker.complete(flat)
            return list(ids)

    assert len(set(asyncio.run(scenario()))) == 20
