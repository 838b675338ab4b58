"""Results by key through the seam (Celery's result backend's store): set, get, incr,
expire, delete, trim, and the hint a stored value gives its key's waiters."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from sqlbroker.core.clock import ManualClock


def test_a_value_is_stored_replaced_read_and_deleted(backend: Any) -> None:
    backend.task_result_set(key="celery-task-meta-1", value=b"first", ttl=60)
    backend.task_result_set(key="celery-task-meta-1", value=b"second", ttl=60)
    backend.task_result_set(key="celery-task-meta-2", value=b"\x00\xffbinary", ttl=60)
    assert backend.task_result_get_many(keys=["celery-task-meta-1", "celery-task-meta-2", "x"]) == {
        "celery-task-meta-1": b"second",
        "celery-task-meta-2": b"\x00\xffbinary",
    }
    assert backend.task_result_delete(keys=["celery-task-meta-1", "x"]) == 1
    assert backend.task_result_get_many(keys=["celery-task-meta-1"]) == {}


def test_rows_expire_for_reads_and_the_trim_removes_them(backend: Any, clock: ManualClock) -> None:
    backend.task_result_set(key="short", value=b"s", ttl=10)
    backend.task_result_set(key="long", value=b"l", ttl=100)
    assert backend.task_result_trim(limit=100) == 0
    clock.advance(11)
    assert backend.task_result_get_many(keys=["short", "long"]) == {"long": b"l"}
    assert not backend.task_result_expire(key="short", ttl=1000), "expired: not revived"
    assert backend.task_result_expire(key="long", ttl=5)
    clock.advance(6)
    assert backend.task_result_get_many(keys=["long"]) == {}
    assert backend.task_result_trim(limit=1) == 1, "at most limit rows"
    assert backend.task_result_trim(limit=100) == 1
    assert backend.task_result_trim(limit=100) == 0


def test_a_counter_counts_keeps_its_expiry_and_restarts_once_expired(
    backend: Any, clock: ManualClock
) -> None:
    assert [backend.task_result_incr(key="chord", ttl=10) for _ in range(3)] == [1, 2, 3]
    clock.advance(5)
    assert backend.task_result_incr(key="chord", ttl=1000) == 4
    clock.advance(6)  # 11 s after the first: its expiry was kept
    assert backend.task_result_incr(key="chord", ttl=10) == 1
    assert backend.task_result_get_many(keys=["chord"]) == {}, "a counter has no value"


def test_operations_join_one_transaction(backend: Any) -> None:
    with backend.begin() as tx:
        tx.task_result_set(key="k", value=b"v", ttl=60)
        assert tx.task_result_incr(key="n", ttl=60) == 1
    assert backend.task_result_get_many(keys=["k"]) == {"k": b"v"}


def test_storing_a_value_wakes_the_waiters_of_its_key(backend: Any) -> None:
    woke = threading.Event()
    with backend.result_watch(message_id="another key") as started:
        # The source's first hint wakes every waiter (it may have missed notifications):
        # let it pass, so that only the stored value can wake the waiter below.
        started.wait(10)
        with backend.result_watch(message_id="celery-task-meta-9") as watch:

            def wait() -> None:
                if watch.wait(60):
                    woke.set()

            waiter = threading.Thread(target=wait)
            waiter.start()
            backend.task_result_set(key="celery-task-meta-9", value=b"done", ttl=60)
            waiter.join(60)
    assert woke.is_set()


def test_the_async_faces_run_the_same_operations(backend: Any) -> None:
    async def main() -> list[Any]:
        ops = backend.async_ops
        await ops.task_result_set(key="k", value=b"v", ttl=60)
        seen = [await ops.task_result_get_many(keys=["k"])]
        async with backend.begin_async() as tx:
            seen.append(await tx.task_result_incr(key="n", ttl=60))
            seen.append(await tx.task_result_expire(key="k", ttl=120))
        seen.append(await ops.task_result_delete(keys=["k", "n"]))
        seen.append(await ops.task_result_trim(limit=10))
        if hasattr(backend, "close_async"):
            await backend.close_async()
        return seen

    assert asyncio.run(main()) == [{"k": b"v"}, 1, True, 2, 0]
