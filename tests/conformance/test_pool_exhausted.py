"""A PostgreSQL pool with no connection to give within ``connect_timeout``: the caller
gets ``ConnectionLost`` (not ambiguous: nothing was sent), never the pool's own error,
from the blocking pool and from the event loop's pool alike."""

from __future__ import annotations

import asyncio

import pytest

import sqlbroker
from sqlbroker.core.errors import ConnectionLost

pytestmark = pytest.mark.postgres

EXHAUSTED = r"no PostgreSQL connection within 1 s \(pool of 1\)"


def test_the_blocking_pool(pg_url: str) -> None:
    with sqlbroker.Broker(pg_url, pool_size=1, connect_timeout=1) as broker:
        with broker.backend.begin():  # holds the only connection
            with pytest.raises(ConnectionLost, match=EXHAUSTED) as raised:
                broker.send("q", 1)
            assert raised.value.ambiguous is False
        assert broker.send("q", 2)
        assert [d.payload for d in broker.claim("q", limit=5)] == [2]


def test_the_event_loop_s_pool(pg_url: str) -> None:
    with sqlbroker.Broker(pg_url, pool_size=1, connect_timeout=1) as broker:
        broker.send("q", 1)
        backend = broker.backend

        async def claim() -> list[sqlbroker.Delivery]:
            return await backend.async_ops.message_claim_many(
                subscription="q", limit=5, lease=30.0, worker="loop"
            )

        async def run() -> None:
            try:
                async with backend.begin_async():
                    with pytest.raises(ConnectionLost, match=EXHAUSTED) as raised:
                        await claim()
                    assert raised.value.ambiguous is False
                assert [d.payload for d in await claim()] == [1]
            finally:
                await backend.close_async()

        asyncio.run(run())
