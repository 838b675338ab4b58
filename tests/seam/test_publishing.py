"""Publishing through the seam, on both dialects: queues created on first use, routing,
idempotency keys, ordering keys, delays and TTLs, the copy limit, and the caller's
transaction. Bad input raises a ValidationError and writes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sqlite3
from datetime import timedelta
from typing import Any

import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import IdempotencyConflict, InvalidOption, LimitExceeded
from sqlbroker.core.limits import Limits
from sqlbroker.core.message import NewMessage, Outcome, State
from sqlbroker.core.topics import stored_pattern_matches
from sqlbroker.storage.factory import open_backend

from .support import claim, new_message, publish


def _keyed(topic: str, key: str, payload: Any, **fields: Any) -> NewMessage:
    message = new_message(topic, payload)
    digest = hashlib.sha256(message.payload).hexdigest()
    return dataclasses.replace(
        message, idempotency_key=key, payload_hash=digest, dedupe_window=60.0, **fields
    )


def _pending(backend: Any, subscription: str | None = None) -> list[Any]:
    return list(backend.message_list(subscription=subscription, state=None, limit=1000))


def _unrouted(backend: Any) -> list[Any]:
    return list(
        backend.archive_list(
            subscription=None, outcome=Outcome.UNROUTED, message_id=None, limit=1000
        )
    )


@pytest.mark.parametrize("count", [1, 3])
def test_a_queue_is_created_by_its_first_send(backend: Any, count: int) -> None:
    messages = [new_message("jobs", {"n": n}) for n in range(count)]
    result = backend.message_insert_many(messages=messages, subscription="jobs")
    assert result.message_ids == [m.message_id for m in messages]
    assert (result.duplicates, result.unrouted) == (0, 0)
    assert [(s.name, s.patterns) for s in backend.subscription_list()] == [("jobs", ("jobs",))]
    assert [d.message_id for d in claim(backend, "jobs")] == result.message_ids


def test_subscription_ensure_creates_once_and_delete_takes_the_copies(backend: Any) -> None:
    assert backend.subscription_ensure(name="jobs") is True
    assert backend.subscription_ensure(name="jobs") is False
    backend.message_insert_many(messages=[new_message("jobs")], subscription="jobs")
    assert backend.subscription_delete(name="jobs") is True
    assert backend.subscription_delete(name="jobs") is False
    assert backend.subscription_list() == []
    assert _pending(backend) == []
    # The next send creates the queue again (PostgreSQL remembered it existed).
    again = new_message("jobs")
    backend.message_insert_many(messages=[again], subscription="jobs")
    assert [d.message_id for d in claim(backend, "jobs")] == [again.message_id]


@pytest.mark.parametrize("batch", [False, True])
def test_routing_fans_out_by_pattern_and_archives_the_unrouted(backend: Any, batch: bool) -> None:
    patterns = {
        "exact": "orders.eu.created",
        "star": "orders.*.created",
        "hash_tail": "orders.#",
        "hash_head": "#.created",
        "middle": "orders.#.created",
        "single": "*",
        "everything": "#",
        "other": "refunds.*",
    }
    for name, pattern in patterns.items():
        backend.subscription_upsert(name=name, patterns=[pattern], replace=False)
    topics = ["orders.eu.created", "orders.created", "orders", "refunds.x.y", "x.created"]
    messages = [new_message(topic) for topic in topics]
    if batch:
        result = backend.message_insert_many(messages=messages, subscription=None)
        assert result.unrouted == 0
    else:
        for message in messages:
            backend.message_insert_many(messages=[message], subscription=None)
    for name, pattern in patterns.items():
        expected = sorted(t for t in topics if stored_pattern_matches(pattern, t))
        assert sorted(m.topic for m in _pending(backend, name)) == expected, name

    backend.subscription_delete(name="everything")
    lost = new_message("refunds.a.b")
    result = backend.message_insert_many(messages=[lost], subscription=None)
    assert result.unrouted == 1
    assert [a.message_id for a in _unrouted(backend)] == [lost.message_id]


def test_a_duplicate_key_returns_the_original_and_writes_nothing(backend: Any) -> None:
    first = _keyed("jobs", "order-1", {"total": 5})
    backend.message_insert_many(messages=[first], subscription="jobs")
    again = _keyed("jobs", "order-1", {"total": 5})
    repeat = _keyed("jobs", "order-1", {"total": 5})
    other = _keyed("jobs", "order-2", {"total": 7})
    result = backend.message_insert_many(messages=[again, other, repeat], subscription="jobs")
    assert result.message_ids == [first.message_id, other.message_id, first.message_id]
    assert result.duplicates == 2
    assert sorted(m.message_id for m in _pending(backend)) == sorted(
        [first.message_id, other.message_id]
    )


def test_a_conflicting_key_raises_and_writes_nothing(backend: Any) -> None:
    first = _keyed("jobs", "order-1", {"total": 5})
    backend.message_insert_many(messages=[first], subscription="jobs")
    fresh = new_message("jobs")
    changed = _keyed("jobs", "order-1", {"total": 6})
    with pytest.raises(IdempotencyConflict):
        backend.message_insert_many(messages=[fresh, changed], subscription="jobs")
    # Inside one batch too: the same key for two payloads.
    a, b = _keyed("jobs", "k", {"n": 1}), _keyed("jobs", "k", {"n": 2})
    with pytest.raises(IdempotencyConflict):
        backend.message_insert_many(messages=[a, b], subscription="jobs")
    assert [m.message_id for m in _pending(backend)] == [first.message_id]


def test_a_key_is_free_again_after_its_window(backend: Any, clock: ManualClock) -> None:
    first = _keyed("jobs", "order-1", {"total": 5})
    backend.message_insert_many(messages=[first], subscription="jobs")
    clock.advance(61)
    later = _keyed("jobs", "order-1", {"total": 6})
    result = backend.message_insert_many(messages=[later], subscription="jobs")
    assert result.message_ids == [later.message_id]


def test_ordering_keys_block_later_copies_delays_schedule_them(
    backend: Any, clock: ManualClock
) -> None:
    keyed = [new_message("jobs", {"n": n}, key="customer-1") for n in range(3)]
    backend.message_insert_many(messages=keyed[:2], subscription="jobs")
    backend.message_insert_many(messages=keyed[2:], subscription="jobs")
    delayed = dataclasses.replace(new_message("jobs"), delay=30.0)
    at = dataclasses.replace(new_message("jobs"), available_at=clock.now() + timedelta(hours=1))
    ttl = dataclasses.replace(new_message("jobs"), ttl=10.0)
    backend.message_insert_many(messages=[delayed, at, ttl], subscription="jobs")
    states = {m.message_id: m for m in _pending(backend, "jobs")}
    assert [states[m.message_id].state for m in keyed] == [
        State.AVAILABLE,
        State.BLOCKED,
        State.BLOCKED,
    ]
    assert states[delayed.message_id].state == State.SCHEDULED
    assert states[delayed.message_id].available_at == clock.now() + timedelta(seconds=30)
    assert states[at.message_id].available_at == clock.now() + timedelta(hours=1)
    assert states[ttl.message_id].expires_at == clock.now() + timedelta(seconds=10)
    assert states[ttl.message_id].state == State.AVAILABLE


@pytest.mark.parametrize("subscription", [None, "jobs"])
def test_past_max_copies_nothing_is_written(backend: Any, subscription: str | None) -> None:
    for name in ("a", "b"):
        backend.subscription_upsert(name=name, patterns=["jobs"], replace=False)
    messages = [new_message("jobs"), _keyed("jobs", "k", {"n": 1})]
    with pytest.raises(LimitExceeded) as raised:
        backend.message_insert_many(messages=messages, subscription=subscription, max_copies=1)
    assert raised.value.limit == 1
    assert _pending(backend) == []
    # The key's reservation went with the rest: another payload may take it now.
    retry = _keyed("jobs", "k", {"n": 2})
    result = backend.message_insert_many(messages=[retry], subscription="a")
    assert result.message_ids == [retry.message_id]


def test_a_queue_past_the_subscription_limit_is_refused(backend_url: str) -> None:
    limited: Any = open_backend(backend_url, limits=Limits(max_subscriptions=1))
    limited.migrate()
    try:
        limited.message_insert_many(messages=[new_message("one")], subscription="one")
        with pytest.raises(LimitExceeded):
            limited.message_insert_many(messages=[new_message("two")], subscription="two")
        with pytest.raises(LimitExceeded):
            limited.subscription_ensure(name="two")
        assert [s.name for s in limited.subscription_list()] == ["one"]
        assert {m.subscription for m in _pending(limited)} == {"one"}
    finally:
        limited.close()


def test_a_publish_joins_the_transaction_and_leaves_with_it(backend: Any) -> None:
    kept, dropped = new_message("jobs"), new_message("jobs")
    with backend.begin() as tx:
        tx.message_insert_many(messages=[kept], subscription="jobs")

    def failing() -> None:
        with backend.begin() as tx:
            tx.message_insert_many(messages=[dropped], subscription="jobs")
            raise RuntimeError("the caller's own step failed")

    with pytest.raises(RuntimeError):
        failing()
    assert [m.message_id for m in _pending(backend)] == [kept.message_id]


def test_the_async_operations_publish_too(backend: Any) -> None:
    async def scenario() -> list[str]:
        messages = [new_message("jobs", {"n": n}) for n in range(2)]
        result = await backend.async_ops.message_insert_many(messages=messages, subscription="jobs")
        async with backend.begin_async() as tx:
            more = await tx.message_insert_many(messages=[new_message("jobs")], subscription="jobs")
        return [*result.message_ids, *more.message_ids]

    ids = asyncio.run(scenario())
    assert sorted(m.message_id for m in _pending(backend)) == sorted(ids)


def test_sqlite_refuses_a_caller_connection_for_coroutines(backend: Any) -> None:
    if backend.name != "sqlite":
        pytest.skip("SQLite only: PostgreSQL joins an AsyncConnection")

    async def scenario() -> None:
        async with backend.begin_async(sqlite3.connect(":memory:")):
            pass

    with pytest.raises(InvalidOption, match="no async connections"):
        asyncio.run(scenario())


def test_a_send_to_an_existing_queue_makes_no_insert_attempt_on_it(
    pg_url: str, pg_server: Any
) -> None:
    # The queue-on-first-use fragment looks before it inserts: an insert attempt that ON
    # CONFLICT turns away still evaluates the subscription table's CHECK constraints (two
    # fifths of a single send's server time). A BEFORE INSERT trigger sees every attempt.
    import psycopg

    from sqlbroker.features.publishing import PublishDefaults, build_batch

    backend = open_backend(pg_url)
    try:
        publish(backend, "jobs", 2)  # creates the queue
        publish(backend, "jobs")  # finds it committed: this backend knows it now
        admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute("CREATE TABLE attempts (name text, statement text)")
            admin.execute(
                "CREATE FUNCTION count_attempt() RETURNS trigger LANGUAGE plpgsql"
                " SECURITY DEFINER AS $$ BEGIN"
                " INSERT INTO attempts VALUES (NEW.name, left(current_query(), 60));"
                " RETURN NEW; END $$"
            )
            admin.execute(
                "CREATE TRIGGER count_attempt BEFORE INSERT ON sqlbroker_subscription"
                " FOR EACH ROW EXECUTE FUNCTION count_attempt()"
            )
            publish(backend, "jobs")  # message_insert_queue_one
            publish(backend, "jobs", key="k")  # message_insert_keyed_one
            shared = build_batch(
                [{"n": n} for n in range(3)],
                defaults=PublishDefaults(max_attempts=5, dedupe_window=60.0, payload_limit=1024),
                topic="jobs",
            )
            backend.message_insert_many(messages=shared, subscription="jobs")
            assert admin.execute("SELECT name, statement FROM attempts").fetchall() == []
            publish(backend, "other")  # a new queue is still created
            assert ("other",) in admin.execute("SELECT name FROM attempts").fetchall()
        assert len(claim(backend, "jobs")) == 8
        assert len(claim(backend, "other")) == 1
    finally:
        backend.close()
