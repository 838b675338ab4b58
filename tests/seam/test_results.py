"""Stored results through the seam: every trace of a message's copies (``result_lookup``),
the retention trim (``result_trim``) and the one shared source of result hints
(``result_watch``, and the result hub's waiters on a loop), on both dialects."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

from tests.seam.support import claim, publish

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.message import ErrorInfo
from sqlbroker.core.settlements import Lease, Settlement

ERROR = ErrorInfo(type="KeyError", message="k", traceback="tb")


def kinds(backend: Any, message_id: str) -> list[str]:
    return sorted(record.kind for record in backend.result_lookup(message_id=message_id))


def test_a_lookup_finds_each_trace_of_a_copy(backend: Any) -> None:
    valued, failed = publish(backend, "jobs", 2)
    assert kinds(backend, valued) == ["pending"]
    first, second = claim(backend, "jobs", 2)
    backend.message_settle_many(
        settlements=[
            Settlement.complete(Lease.of(first), b'{"total": 3}'),
            Settlement.dead(Lease.of(second), "poison", ERROR),
        ]
    )

    assert kinds(backend, valued) == ["completed", "value"]
    (stored,) = [r for r in backend.result_lookup(message_id=valued) if r.kind == "value"]
    assert (stored.subscription, stored.value) == ("jobs", b'{"total": 3}')
    assert stored.finished_at is not None
    assert stored.finished_at.tzinfo is not None
    (dead,) = backend.result_lookup(message_id=failed)
    assert (dead.kind, dead.reason, dead.error_type, dead.traceback) == (
        "dead",
        "poison",
        "KeyError",
        "tb",
    )
    assert backend.result_lookup(message_id=str(uuid.uuid4())) == []


def test_a_lookup_inside_a_transaction_sees_its_uncommitted_writes(backend: Any) -> None:
    (message_id,) = publish(backend, "jobs")
    (delivery,) = claim(backend, "jobs")
    with backend.begin() as tx:
        tx.message_settle_many(settlements=[Settlement.complete(Lease.of(delivery), b"1")])
        assert "value" in [r.kind for r in tx.result_lookup(message_id=message_id)]


def test_trim_deletes_only_values_past_their_time(backend: Any, clock: ManualClock) -> None:
    old, new = publish(backend, "jobs", 2)
    (first,) = claim(backend, "jobs", 1)
    backend.message_settle_many(settlements=[Settlement.complete(Lease.of(first), b"old")])
    clock.advance(100)
    (second,) = claim(backend, "jobs", 1)
    backend.message_settle_many(settlements=[Settlement.complete(Lease.of(second), b"new")])
    clock.advance(10)

    assert backend.result_trim(ttl=50, limit=10) == 1
    assert kinds(backend, old) == ["completed"]
    assert kinds(backend, new) == ["completed", "value"]
    assert backend.result_trim(ttl=50, limit=10) == 0

    async def trim() -> int:
        try:
            trimmed: int = await backend.async_ops.result_trim(ttl=5, limit=10)
            return trimmed
        finally:
            await backend.close_async()

    assert asyncio.run(trim()) == 1


def test_a_stored_value_wakes_its_watch(backend: Any) -> None:
    (message_id,) = publish(backend, "jobs")
    (delivery,) = claim(backend, "jobs")
    with backend.result_watch(message_id=message_id) as watch:
        settle = threading.Thread(
            target=backend.message_settle_many,
            kwargs={"settlements": [Settlement.complete(Lease.of(delivery), b"42")]},
        )
        settle.start()
        woke = watch.wait(30)
        settle.join()
    assert woke
    assert "value" in kinds(backend, message_id)


def test_a_dead_letter_wakes_a_waiter_on_a_loop(backend: Any) -> None:
    (message_id,) = publish(backend, "jobs")
    (delivery,) = claim(backend, "jobs")

    async def main() -> bool:
        waiter = backend.result_hub.register(message_id)
        try:
            await waiter.ready_async()
            await backend.async_ops.message_settle_many(
                settlements=[Settlement.dead(Lease.of(delivery), "poison", ERROR)]
            )
            woke: bool = await waiter.wait_async(30)
            return woke
        finally:
            backend.result_hub.unregister(message_id, waiter)
            await backend.close_async()

    assert asyncio.run(main())
    assert kinds(backend, message_id) == ["dead"]


def test_every_watch_shares_one_source(backend: Any) -> None:
    ids = publish(backend, "jobs", 3)
    before = {thread.ident for thread in threading.enumerate()}
    with (
        backend.result_watch(message_id=ids[0]),
        backend.result_watch(message_id=ids[1]),
        backend.result_watch(message_id=ids[2]),
    ):
        started = [t for t in threading.enumerate() if t.ident not in before]
    assert [thread.name for thread in started] == ["sqlbroker-result"]
