"""A queue batch on PostgreSQL takes one of three statements: one message alone its scalar
form, a batch whose options all match (``send_many``) the shared form with scalar options,
any other batch the form over arrays. Each stores a copy exactly as the others do, and
wakes the queue's workers only when a copy is claimable. SQLite runs every message alone:
the same promises hold there."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.message import NewMessage, SharedBatch
from sqlbroker.features.publishing import PublishDefaults, build_batch

from .support import claim, new_message

CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "options": {"priority": 7, "headers": '{"h":"v"}', "max_attempts": 9, "ttl": 30.0},
    "delayed": {"delay": 15.0, "ttl": 60},
    "absolute": {"available_at": timedelta(hours=1), "expires_at": timedelta(hours=2)},
    "bytes": {"payload": b"\x00raw", "content_type": "application/octet-stream"},
}


def _batch(queue: str, clock: ManualClock, fields: dict[str, Any], count: int) -> list[NewMessage]:
    resolved = {
        name: clock.now() + value if isinstance(value, timedelta) else value
        for name, value in fields.items()
    }
    return [dataclasses.replace(new_message(queue, {"n": n}), **resolved) for n in range(count)]


def _stored(backend: Any, queue: str) -> list[tuple[Any, ...]]:
    pending = backend.message_list(subscription=queue, state=None, limit=100)
    return [
        (
            m.topic == queue,
            m.state,
            m.priority,
            m.max_attempts,
            m.attempts,
            m.enqueued_at,
            m.available_at,
            m.expires_at,
        )
        for m in sorted(pending, key=lambda m: m.id)
    ]


def _delivered(backend: Any, queue: str) -> list[tuple[Any, ...]]:
    return [
        (d.topic == queue, d.payload, d.content_type, d.headers, d.priority, d.max_attempts)
        for d in sorted(claim(backend, queue), key=lambda d: d.id)
    ]


@pytest.mark.parametrize("case", CASES)
def test_a_shared_batch_stores_what_single_sends_and_a_mixed_batch_store(
    backend: Any, clock: ManualClock, case: str
) -> None:
    fields = CASES[case]
    shared = _batch("shared", clock, fields, 3)
    backend.message_insert_many(messages=shared, subscription="shared")
    for message in _batch("single", clock, fields, 3):
        backend.message_insert_many(messages=[message], subscription="single")
    # A fourth message of another priority: the batch's columns are no longer all shared.
    mixed = _batch("mixed", clock, fields, 3)
    odd = dataclasses.replace(_batch("mixed", clock, fields, 1)[0], priority=9)
    backend.message_insert_many(messages=[*mixed, odd], subscription="mixed")

    expected = _stored(backend, "single")
    assert len(expected) == 3
    assert _stored(backend, "shared") == expected
    assert _stored(backend, "mixed")[:3] == expected
    delivered = _delivered(backend, "single")
    assert _delivered(backend, "shared") == delivered
    assert _delivered(backend, "mixed")[:3] == delivered
    if case in ("delayed", "absolute"):
        assert delivered == []


def test_a_shared_batch_wakes_the_workers_only_with_a_claimable_copy(
    backend: Any, backend_url: str, clock: ManualClock
) -> None:
    if not backend_url.startswith("postgresql"):
        pytest.skip("SQLite has no NOTIFY (its watchers poll data_version)")
    import psycopg

    channel = backend.settings.notify_channel
    with psycopg.connect(backend_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        backend.message_insert_many(
            messages=_batch("later", clock, {"delay": 30.0}, 3), subscription="later"
        )
        backend.message_insert_many(messages=_batch("now", clock, {}, 3), subscription="now")
        heard = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
        heard += [(n.channel, n.payload) for n in listener.notifies(timeout=0.5)]
    assert heard == [(channel, "now")]


def test_a_shared_batch_is_claimed_in_the_order_it_was_sent(
    backend: Any, clock: ManualClock
) -> None:
    # A SharedBatch (send_many's), read by column: its copies go in in its order.
    count = 40
    batch = build_batch(
        [{"n": n} for n in range(count)],
        defaults=PublishDefaults(max_attempts=5, dedupe_window=60.0, payload_limit=1024),
        topic="ordered",
    )
    assert isinstance(batch, SharedBatch)
    sent = backend.message_insert_many(messages=batch, subscription="ordered").message_ids
    assert sent == [m.message_id for m in batch]
    delivered = claim(backend, "ordered", limit=count)
    assert [d.message_id for d in delivered] == sent
    assert [d.payload for d in delivered] == [{"n": n} for n in range(count)]


def test_a_routed_batch_runs_without_jit_compilation(backend: Any, backend_url: str) -> None:
    # message_insert over 500 copies is estimated at millions: with JIT on, PostgreSQL
    # compiled it on every run (200+ ms of server CPU for a statement of 19 ms).
    if not backend_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: SQLite has no JIT")
    import psycopg

    backend.subscription_upsert(name="routed", patterns=["orders.*"], replace=False)
    messages = [new_message("orders.created", {"n": n}) for n in range(500)]
    assert backend.message_insert_many(messages=messages, subscription=None).unrouted == 0
    with psycopg.connect(backend.conninfo, **backend.connection_kwargs()) as conn:
        row = conn.execute("SHOW jit").fetchone()
    assert row == ("off",)


@pytest.mark.parametrize("case", [*CASES, "keyed"])
def test_a_routed_shared_batch_stores_what_single_publishes_and_a_mixed_batch_store(
    backend: Any, clock: ManualClock, case: str
) -> None:
    # Routed (publish_many, or a queue batch with a key): the shared form with scalar
    # options against one message at a time and the form over arrays.
    fields = {"ordering_key": "k"} if case == "keyed" else CASES[case]
    for name in ("shared", "single", "mixed"):
        backend.subscription_upsert(name=name, patterns=[f"{name}.*"], replace=False)
    backend.message_insert_many(messages=_batch("shared.t", clock, fields, 3), subscription=None)
    for message in _batch("single.t", clock, fields, 3):
        backend.message_insert_many(messages=[message], subscription=None)
    mixed = _batch("mixed.t", clock, fields, 3)
    odd = dataclasses.replace(_batch("mixed.t", clock, fields, 1)[0], priority=9)
    backend.message_insert_many(messages=[*mixed, odd], subscription=None)

    expected = _stored(backend, "single")
    assert len(expected) == 3
    assert _stored(backend, "shared") == expected
    assert _stored(backend, "mixed")[:3] == expected
    if case == "keyed":
        assert [row[1] for row in expected] == ["available", "blocked", "blocked"]
