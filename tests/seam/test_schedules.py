"""Schedules through the seam: upsert, list, delete, pause and resume, the due scan, and
firing (advance by compare-and-set, publish, point at the last message)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import IdempotencyConflict
from sqlbroker.core.message import NewMessage
from sqlbroker.core.schedules import Missed
from sqlbroker.features.publishing import PublishDefaults, build_message
from sqlbroker.storage.schedules import ScheduleDefinition, ScheduleFire, ScheduleRecord

START = datetime(2024, 3, 30, 12, 0, tzinfo=UTC)
DEFAULTS = PublishDefaults(max_attempts=3, dedupe_window=3600, payload_limit=1 << 20)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def definition(name: str = "tick", **changes: Any) -> ScheduleDefinition:
    base = ScheduleDefinition(
        name=name,
        topic=f"t.{name}",
        cron=None,
        every=60.0,
        tz="UTC",
        missed=Missed.LATEST,
        grace=0.0,
        start_at=None,
        anchor_at=START + timedelta(seconds=60),
        payload=b'{"n": 1}',
        content_type="application/json",
        headers='{"h": "v"}',
        priority=5,
        ordering_key=None,
        ttl=None,
        max_attempts=3,
        definition_hash="d1",
        timing_hash="t1",
        next_run_at=START + timedelta(seconds=60),
    )
    return dataclasses.replace(base, **changes)


def fire_of(record: ScheduleRecord, *messages: NewMessage) -> ScheduleFire:
    return ScheduleFire(
        name=record.name,
        expected_next_run_at=record.next_run_at,
        definition_hash=record.definition_hash,
        next_run_at=record.next_run_at + timedelta(seconds=60),
        last_run_at=record.next_run_at,
        messages=list(messages),
    )


def tick_message(topic: str, key: str) -> NewMessage:
    return build_message(topic, {"tick": key}, defaults=DEFAULTS, idempotency_key=key)


def test_upsert_keeps_timing_unless_it_changed(backend: Any, clock: ManualClock) -> None:
    first = backend.schedule_upsert(definition=definition())
    assert (first.name, first.every, first.priority, first.paused) == ("tick", 60.0, 5, False)
    assert (first.payload, first.headers, first.damaged) == (b'{"n": 1}', '{"h": "v"}', None)
    assert first.next_run_at == START + timedelta(seconds=60)
    clock.advance(5)
    assert backend.schedule_upsert(definition=definition()) == first  # identical: untouched
    moved = START + timedelta(hours=1)
    same_timing = backend.schedule_upsert(
        definition=definition(definition_hash="d2", priority=1, next_run_at=moved)
    )
    assert (same_timing.priority, same_timing.next_run_at) == (1, first.next_run_at)
    assert same_timing.updated_at > first.updated_at
    new_timing = backend.schedule_upsert(
        definition=definition(definition_hash="d3", timing_hash="t2", next_run_at=moved)
    )
    assert new_timing.next_run_at == moved


def test_list_delete_pause_and_resume(backend: Any) -> None:
    for name in ("b", "a", "c"):
        backend.schedule_upsert(definition=definition(name))
    assert [r.name for r in backend.schedule_list(names=None)] == ["a", "b", "c"]
    assert [r.name for r in backend.schedule_list(names=["c", "zz", "a"])] == ["a", "c"]
    assert backend.schedule_list(names=[]) == []
    assert backend.schedule_delete(name="c")
    assert not backend.schedule_delete(name="c")
    assert backend.schedule_set_paused(name="a", paused=True, next_run_at=None)
    assert backend.schedule_list(names=["a"])[0].paused
    later = START + timedelta(days=1)
    assert backend.schedule_set_paused(name="a", paused=False, next_run_at=later)
    resumed = backend.schedule_list(names=["a"])[0]
    assert (resumed.paused, resumed.next_run_at) == (False, later)
    # Resuming a running schedule changes nothing; a missing one does not exist.
    assert backend.schedule_set_paused(name="a", paused=False, next_run_at=START)
    assert backend.schedule_list(names=["a"])[0].next_run_at == later
    assert not backend.schedule_set_paused(name="zz", paused=True, next_run_at=None)


def test_due_returns_the_clock_the_due_and_the_next_run(backend: Any, clock: ManualClock) -> None:
    nothing = backend.schedule_due(limit=10)
    assert (nothing.now, nothing.due, nothing.next_run_at) == (START, [], None)
    backend.schedule_upsert(definition=definition("late", next_run_at=START + timedelta(60)))
    backend.schedule_upsert(definition=definition("b", next_run_at=START + timedelta(seconds=30)))
    backend.schedule_upsert(definition=definition("a", next_run_at=START + timedelta(seconds=30)))
    backend.schedule_upsert(definition=definition("p", next_run_at=START))
    backend.schedule_set_paused(name="p", paused=True, next_run_at=None)
    clock.advance(30)
    due = backend.schedule_due(limit=10)
    assert due.now == START + timedelta(seconds=30)
    assert [r.name for r in due.due] == ["a", "b"]
    assert due.next_run_at == START + timedelta(60)
    assert [r.name for r in backend.schedule_due(limit=1).due] == ["a"]


def test_a_fire_advances_once_and_publishes_its_messages(backend: Any) -> None:
    backend.subscription_upsert(name="seen", patterns=["#"], replace=False)
    record = backend.schedule_upsert(definition=definition())
    message = tick_message("t.tick", "schedule:tick:1")
    fired = backend.schedule_fire_many(fires=[fire_of(record, message)])
    assert fired == {"tick": [message.message_id]}
    after = backend.schedule_list(names=["tick"])[0]
    assert after.next_run_at == record.next_run_at + timedelta(seconds=60)
    assert (after.last_run_at, after.last_message_id) == (record.next_run_at, message.message_id)
    # The same fire again lost the race: nothing is published.
    assert backend.schedule_fire_many(fires=[fire_of(record, message)]) == {}
    assert backend.schedule_fire_many(fires=[]) == {}
    assert (
        len(backend.message_claim_many(subscription="seen", limit=10, lease=30, worker=None)) == 1
    )


def test_a_tick_whose_key_was_taken_points_at_the_earlier_message(backend: Any) -> None:
    backend.subscription_upsert(name="seen", patterns=["#"], replace=False)
    earlier = tick_message("t.tick", "schedule:tick:1")
    backend.message_insert_many(messages=[earlier], subscription=None)
    record = backend.schedule_upsert(definition=definition())
    again = tick_message("t.tick", "schedule:tick:1")
    assert backend.schedule_fire_many(fires=[fire_of(record, again)]) == {
        "tick": [earlier.message_id]
    }
    assert backend.schedule_list(names=["tick"])[0].last_message_id == earlier.message_id


def test_upsert_joins_the_caller_s_transaction(backend: Any) -> None:
    def failing() -> None:
        with backend.begin() as own, backend.begin(own.connection) as tx:
            tx.schedule_upsert(definition=definition())
            raise RuntimeError("the caller's own step failed")

    with pytest.raises(RuntimeError, match="own step failed"):
        failing()
    assert backend.schedule_list(names=None) == []
    with backend.begin() as own, backend.begin(own.connection) as tx:
        assert tx.schedule_upsert(definition=definition()).name == "tick"
    assert [r.name for r in backend.schedule_list(names=None)] == ["tick"]


def test_the_async_faces_run_the_same_operations(backend: Any) -> None:
    async def main() -> list[Any]:
        record = await backend.async_ops.schedule_upsert(definition=definition())
        async with backend.begin_async() as tx:
            seen: list[Any] = [await tx.schedule_fire_many(fires=[fire_of(record)])]
        seen.append([r.name for r in await backend.async_ops.schedule_list(names=None)])
        seen.append(await backend.async_ops.schedule_delete(name="tick"))
        if hasattr(backend, "close_async"):
            await backend.close_async()
        return seen

    assert asyncio.run(main()) == [{"tick": []}, ["tick"], True]


def test_a_fire_is_one_transaction_for_coroutines_too(backend: Any) -> None:
    """``schedule_fire_many`` is one operation on both executors: a publish that fails
    (a tick whose key holds another payload) rolls the advance back, and a good fire
    advances and publishes, from a coroutine."""
    backend.subscription_upsert(name="seen", patterns=["#"], replace=False)
    record = backend.schedule_upsert(definition=definition())
    taken = build_message("t.tick", {"other": 1}, defaults=DEFAULTS, idempotency_key="k:1")
    backend.message_insert_many(messages=[taken], subscription=None)
    clash = tick_message("t.tick", "k:1")  # same key, another payload
    good = tick_message("t.tick", "k:2")

    async def main() -> dict[str, list[str]]:
        try:
            with pytest.raises(IdempotencyConflict):
                await backend.async_ops.schedule_fire_many(fires=[fire_of(record, clash)])
            assert backend.schedule_list(names=["tick"])[0].next_run_at == record.next_run_at
            fired: dict[str, list[str]] = await backend.async_ops.schedule_fire_many(
                fires=[fire_of(record, good)]
            )
            return fired
        finally:
            await backend.close_async()

    assert asyncio.run(main()) == {"tick": [good.message_id]}
    assert backend.schedule_list(names=["tick"])[0].last_message_id == good.message_id
