"""Debounce and replace through the seam, on both dialects: ``message_insert_many`` with
messages marked ``replace`` (and ``debounce``/``debounce_max``), inside its own
transaction and the caller's (``backend.begin()``); ``InsertResult.replaced`` counts the
pending copies that took a message's place."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.message import NewMessage, State

from .support import claim, new_message


def _replacing(
    topic: str, payload: Any, key: str = "k", debounce: float | None = None, **fields: Any
) -> NewMessage:
    return dataclasses.replace(
        new_message(topic, payload, key=key),
        replace=True,
        debounce=debounce,
        delay=debounce,
        **fields,
    )


def _states(backend: Any, subscription: str) -> list[tuple[str, State]]:
    found = backend.message_list(subscription=subscription, state=None, limit=100)
    return [(m.message_id, m.state) for m in found]


def test_replace_folds_a_batch_and_later_sends_into_one_pending_copy(backend: Any) -> None:
    batch = [_replacing("jobs", n) for n in range(3)]
    result = backend.message_insert_many(messages=batch, subscription="jobs")
    assert (result.message_ids, result.replaced) == ([m.message_id for m in batch], 2)
    later = _replacing("jobs", "later")
    assert backend.message_insert_many(messages=[later], subscription="jobs").replaced == 1
    plain = new_message("jobs", "plain", key="k")
    assert backend.message_insert_many(messages=[plain], subscription="jobs").replaced == 0
    assert _states(backend, "jobs") == [
        (later.message_id, State.AVAILABLE),
        (plain.message_id, State.BLOCKED),
    ]
    # The plain copy is the key's last now: the next replace takes its place.
    last = _replacing("jobs", "last")
    assert backend.message_insert_many(messages=[last], subscription="jobs").replaced == 1
    (head,) = claim(backend, "jobs")
    assert (head.message_id, head.payload) == (later.message_id, "later")
    assert _states(backend, "jobs")[1] == (last.message_id, State.BLOCKED)


def test_a_running_copy_is_never_replaced(backend: Any) -> None:
    first = _replacing("jobs", 1)
    backend.message_insert_many(messages=[first], subscription="jobs")
    assert len(claim(backend, "jobs")) == 1
    second = _replacing("jobs", 2)
    assert backend.message_insert_many(messages=[second], subscription="jobs").replaced == 0
    assert _states(backend, "jobs") == [
        (first.message_id, State.RUNNING),
        (second.message_id, State.BLOCKED),
    ]


def test_debounce_moves_the_pending_copy_within_its_maximum_wait(
    backend: Any, clock: ManualClock
) -> None:
    first = _replacing("jobs", 1, debounce=10.0, debounce_max=15.0)
    backend.message_insert_many(messages=[first], subscription="jobs")
    (pending,) = backend.message_list(subscription="jobs", state=None, limit=10)
    assert (pending.state, pending.available_at) == (State.SCHEDULED, pending.enqueued_at + _s(10))
    clock.advance(8)
    second = _replacing("jobs", 2, debounce=10.0, debounce_max=15.0)
    backend.message_insert_many(messages=[second], subscription="jobs")
    (moved,) = backend.message_list(subscription="jobs", state=None, limit=10)
    assert (moved.message_id, moved.enqueued_at) == (second.message_id, pending.enqueued_at)
    assert moved.available_at == pending.enqueued_at + _s(15)
    clock.advance(7.5)
    third = _replacing("jobs", 3, debounce=10.0, debounce_max=15.0)
    backend.message_insert_many(messages=[third], subscription="jobs")
    assert [(d.message_id, d.payload) for d in claim(backend, "jobs")] == [(third.message_id, 3)]


def test_replace_joins_the_callers_transaction_and_rolls_back_with_it(backend: Any) -> None:
    first = _replacing("jobs", 1)
    backend.message_insert_many(messages=[first], subscription="jobs")

    class Undo(Exception):
        pass

    try:
        with backend.begin() as tx:
            assert tx.message_insert_many(messages=[_replacing("jobs", 2)], subscription="jobs")
            raise Undo
    except Undo:
        pass
    with backend.begin() as tx:
        kept = _replacing("jobs", 3)
        assert tx.message_insert_many(messages=[kept], subscription="jobs").replaced == 1
    assert [(d.message_id, d.payload) for d in claim(backend, "jobs")] == [(kept.message_id, 3)]


def test_the_async_executor_replaces_the_same_way(backend: Any) -> None:
    async def main() -> int:
        async with backend.begin_async() as tx:
            await tx.message_insert_many(messages=[_replacing("jobs", 1)], subscription="jobs")
            result = await tx.message_insert_many(
                messages=[_replacing("jobs", 2)], subscription="jobs"
            )
            return int(result.replaced)

    assert asyncio.run(main()) == 1
    assert [d.payload for d in claim(backend, "jobs")] == [2]


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
