"""AsyncBroker: the same operations, awaitable (run with asyncio.run; no plugin needed)."""

from __future__ import annotations

import asyncio

import pytest

import sqlbroker
from helpers import table_counts


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


def test_async_schedules_refuse_what_the_sync_broker_refuses(backend_url: str) -> None:
    async def scenario() -> list[tuple[type[Exception], str]]:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            await broker.schedule("nightly", "reports", 1, every=3600)
            assert [s.name for s in await broker.schedules(["nightly"])] == ["nightly"]
            assert [s.name for s in await broker.schedules(name for name in ["nightly"])] == [
                "nightly"
            ]
            refused = []
            for names in ("nightly", 5, {"nightly": 1}):
                with pytest.raises(sqlbroker.ValidationError) as caught:
                    await broker.schedules(names)  # type: ignore[arg-type]
                refused.append((type(caught.value), caught.value.field))
            return refused

    assert asyncio.run(scenario()) == [
        (sqlbroker.InvalidSchedule, "names"),
        (sqlbroker.InvalidOption, "names"),
        (sqlbroker.InvalidOption, "names"),
    ]


def test_header_hooks_apply_to_async_publishes(backend_url: str) -> None:
    """On every path, including an async connection's outbox (PostgreSQL)."""

    async def scenario() -> list[dict[str, str]]:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            broker.add_header_hook(lambda: {"traceparent": "00-hook"})
            await broker.send("q", 1)
            await broker.send("q", 2, headers={"traceparent": "00-own"})
            if backend_url.startswith("postgresql"):
                import psycopg

                async with await psycopg.AsyncConnection.connect(backend_url) as conn:
                    await broker.publish("q", 3, conn=conn)
                    await broker.send("q", 4, conn=conn)
                    await broker.publish_many([{"topic": "q", "payload": 5}], conn=conn)
                    await broker.send_many("q", [6], conn=conn)
                    await conn.commit()
            return [d.headers for d in await broker.claim("q", limit=10)]

    headers = asyncio.run(scenario())
    assert headers[1] == {"traceparent": "00-own"}
    assert headers[:1] + headers[2:] == [{"traceparent": "00-hook"}] * (len(headers) - 1)
    assert len(headers) == (6 if backend_url.startswith("postgresql") else 2)


def test_headers_from_a_hook_are_validated(backend_url: str) -> None:
    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            broker.add_header_hook(lambda: {"a": 1})  # type: ignore[dict-item]
            await broker.send("q", 1)

    with pytest.raises(sqlbroker.InvalidHeaders, match="header hook") as caught:
        asyncio.run(scenario())
    assert caught.value.field == "headers"


def test_hook_headers_count_towards_the_limit(broker: sqlbroker.Broker) -> None:
    broker.add_header_hook(lambda: {f"hook{i}": "v" for i in range(40)})
    broker.send("q", 1, headers={f"own{i}": "v" for i in range(24)})
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.InvalidHeaders) as caught:
        broker.send("q", 2, headers={f"own{i}": "v" for i in range(25)})
    assert caught.value.field == "headers"
    assert table_counts(broker.backend) == before
