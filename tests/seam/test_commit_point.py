"""A plan's commit point (``plan.commit_point()``) runs on every dialect, alone, as a
coroutine and inside a transaction: SQLite commits there when the plan runs alone;
PostgreSQL, whose statements commit on their own anyway, passes over it."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlbroker.storage.plan import WRITE, Plan, commit_point, query


def _plan(first: str, second: str) -> Plan[str]:
    yield query("queue_create", name=first)
    yield commit_point()
    yield query("queue_create", name=second)
    return second


def test_a_commit_point_is_run_by_every_dialect_and_runner(backend: Any) -> None:
    async def run_async() -> str:
        try:
            done: str = await backend.async_ops.execute(_plan("c", "d"), WRITE)
            return done
        finally:
            await backend.close_async()

    assert backend.execute(_plan("a", "b"), WRITE) == "b"
    assert asyncio.run(run_async()) == "d"
    with backend.begin() as tx:
        assert tx.execute(_plan("e", "f"), WRITE) == "f"
    names = [s.name for s in backend.subscription_list()]
    assert sorted(names) == ["a", "b", "c", "d", "e", "f"]
