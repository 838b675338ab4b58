"""Sagas through the seam: insert, get (and lock), update, step update, list, due, counts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.sagas import DueSaga, NewSaga, SagaStatus, StepStatus


def new(saga_id: str = "s-1", *, timeout: float = 60) -> NewSaga:
    return NewSaga(
        id=saga_id,
        name="order",
        data='{"sku": "A-1"}',
        steps=(("reserve", True), ("charge", False), ("ship", True)),
        timeout=timeout,
    )


def test_insert_writes_the_saga_and_its_steps_once(backend: Any) -> None:
    assert backend.saga_insert(saga=new())
    assert not backend.saga_insert(saga=new())
    saga = backend.saga_get(id="s-1")
    assert (saga.name, saga.status, saga.step, saga.version) == ("order", "running", 0, 1)
    assert saga.data == {"sku": "A-1"}
    assert saga.damaged is None
    assert saga.deadline is not None
    assert (saga.deadline - saga.created_at).total_seconds() == pytest.approx(60)
    assert [(s.index, s.name, s.compensate, s.status) for s in saga.steps] == [
        (0, "reserve", True, StepStatus.PENDING),
        (1, "charge", False, StepStatus.PENDING),
        (2, "ship", True, StepStatus.PENDING),
    ]
    assert backend.saga_get(id="s-1", steps=False).steps == ()
    assert backend.saga_get(id="nope") is None


def test_a_saga_without_steps_is_inserted_alone(backend: Any) -> None:
    empty = NewSaga(id="e", name="empty", data="null", steps=(), timeout=5)
    assert backend.saga_insert(saga=empty)
    assert backend.saga_get(id="e").steps == ()


def test_update_is_a_compare_and_set_on_the_version(backend: Any, clock: ManualClock) -> None:
    backend.saga_insert(saga=new())
    change = {"status": "running", "step": 1, "error": None, "message_id": None}
    assert backend.saga_update(id="s-1", version=1, **change)
    assert not backend.saga_update(id="s-1", version=1, **change)  # it moved on
    clock.advance(30)
    assert backend.saga_update(
        id="s-1",
        version=2,
        status="compensating",
        step=1,
        error="boom",
        message_id=None,
        restart_deadline=True,
    )
    saga = backend.saga_get(id="s-1")
    assert (saga.status, saga.version, saga.error) == ("compensating", 3, "boom")
    assert (saga.deadline - saga.created_at).total_seconds() == pytest.approx(90)
    assert backend.saga_update(
        id="s-1", version=3, status="compensated", step=0, error="boom", message_id=None
    )
    saga = backend.saga_get(id="s-1")
    assert saga.deadline is None
    assert saga.finished_at is not None


def test_step_update_stamps_times_and_keeps_the_highest_attempts(backend: Any) -> None:
    backend.saga_insert(saga=new())
    assert backend.saga_step_update(saga_id="s-1", index=0, status="running")
    assert backend.saga_step_update(
        saga_id="s-1", index=0, status="done", attempts=3, output='{"ok": true}'
    )
    assert backend.saga_step_update(saga_id="s-1", index=0, status="compensated", attempts=1)
    assert not backend.saga_step_update(saga_id="s-1", index=9, status="done")
    step = backend.saga_get(id="s-1").steps[0]
    assert (step.status, step.attempts, step.output) == (StepStatus.COMPENSATED, 3, {"ok": True})
    assert step.started_at is not None
    assert step.finished_at is not None
    assert step.compensated_at is not None


def test_list_counts_and_due(backend: Any, clock: ManualClock) -> None:
    backend.saga_insert(saga=new("a", timeout=10))
    clock.advance(1)
    backend.saga_insert(saga=new("b", timeout=100))
    backend.saga_update(id="b", version=1, status="completed", step=2, error=None, message_id=None)
    assert [s.id for s in backend.saga_list(name=None, status=None, limit=10)] == ["b", "a"]
    assert [s.id for s in backend.saga_list(name="order", status="running", limit=10)] == ["a"]
    assert backend.saga_list(name="other", status=None, limit=10) == []
    assert backend.saga_counts() == {"running": 1, "completed": 1}
    assert backend.saga_due(limit=10) == []
    clock.advance(10)
    assert backend.saga_due(limit=10) == [
        DueSaga(id="a", version=1, expired=True, dead_reason=None)
    ]


def test_a_transaction_joins_every_operation_and_rolls_back_whole(backend: Any) -> None:
    def failing_transition() -> None:
        with backend.begin() as tx:
            assert tx.saga_insert(saga=new())
            assert tx.saga_get(id="s-1", lock=True).status == SagaStatus.RUNNING
            raise RuntimeError("the transition failed")

    with pytest.raises(RuntimeError, match="the transition failed"):
        failing_transition()
    assert backend.saga_get(id="s-1") is None
    with backend.begin() as tx:
        tx.saga_insert(saga=new())
        saga = tx.saga_get(id="s-1", lock=True)
        tx.saga_step_update(saga_id="s-1", index=0, status="running")
        assert tx.saga_update(
            id="s-1", version=saga.version, status="running", step=0, error=None, message_id=None
        )
    assert backend.saga_get(id="s-1").version == 2


def test_the_caller_s_transaction_is_joined(backend: Any) -> None:
    with backend.begin() as own:
        conn = own.connection
        with backend.begin(conn) as tx:
            tx.saga_insert(saga=new())
        with backend.begin(conn) as tx:
            assert tx.saga_get(id="s-1", lock=True) is not None
    assert backend.saga_counts() == {"running": 1}


def test_the_async_faces_run_the_same_operations(backend: Any) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = [await backend.async_ops.saga_insert(saga=new())]
        async with backend.begin_async() as tx:
            saga = await tx.saga_get(id="s-1", lock=True)
            seen.append(
                await tx.saga_update(
                    id="s-1",
                    version=saga.version,
                    status="failed",
                    step=0,
                    error="x",
                    message_id=None,
                )
            )
        seen.append(await backend.async_ops.saga_counts())
        if hasattr(backend, "close_async"):
            await backend.close_async()
        return seen

    assert asyncio.run(main()) == [True, True, {"failed": 1}]
