"""Failures the state machine and the fuzzers found, kept as plain tests.

State-machine regressions replay the shrunk step list on ``BrokerMachine`` (each rule
checks its own result, and ``database_matches_the_model`` the whole database); fuzzer
regressions call the entry point with the input that escaped validation.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sqlbroker
from helpers import table_counts
from properties.machine import BrokerMachine


def test_a_duplicate_send_does_not_create_its_queue(backend_url: str) -> None:
    """SQLite created the queue of a ``send`` whose idempotency key made it a duplicate of
    an unrouted publish to the same topic: a duplicate must write nothing (PostgreSQL
    wrote nothing)."""
    state = BrokerMachine.for_url(backend_url)()
    try:
        state.publish(
            via="publish",
            topic="q",
            payload=0,
            priority=2,
            key=None,
            delay=None,
            ttl=None,
            max_attempts=None,
            idempotency_key="i1",
            dedupe_window=None,
        )
        state.database_matches_the_model()
        state.publish(
            via="send",
            topic="q",
            payload=0,
            priority=2,
            key=None,
            delay=None,
            ttl=None,
            max_attempts=None,
            idempotency_key="i1",
        )
        state.database_matches_the_model()
        assert "q" not in {s.name for s in state.broker.subscriptions()}
    finally:
        state.teardown()


def test_a_duration_beyond_any_float_is_invalid(broker: sqlbroker.Broker) -> None:
    with pytest.raises(sqlbroker.InvalidDuration) as caught:
        broker.send("q", 1, delay=10**400)
    assert caught.value.field == "delay"
    with pytest.raises(sqlbroker.InvalidDuration) as caught:
        sqlbroker.Broker(broker.url, lease=-(10**400))
    assert caught.value.field == "lease"


@pytest.mark.parametrize("url", ["sqlite:///a\x00b.db", "sqlite:///%00"])
def test_a_sqlite_url_with_nul_is_a_configuration_error(url: str) -> None:
    with pytest.raises(sqlbroker.ConfigurationError):
        sqlbroker.Broker(url)


def test_unknown_backend_options_and_clocks_are_invalid(backend_url: str) -> None:
    with pytest.raises(sqlbroker.InvalidOption) as caught:
        sqlbroker.Broker(backend_url, colour="red")
    assert caught.value.field == "colour"
    with pytest.raises(sqlbroker.InvalidOption) as caught:
        sqlbroker.Broker(backend_url, clock=5)
    assert caught.value.field == "clock"


@pytest.mark.parametrize("patterns", [None, 5, {"a": 1}, b"a.b"])
def test_subscribe_refuses_what_is_not_a_list_of_patterns(
    broker: sqlbroker.Broker, patterns: Any
) -> None:
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.InvalidOption) as caught:
        broker.subscribe("s", patterns)
    assert caught.value.field == "patterns"
    assert table_counts(broker.backend) == before


@pytest.mark.parametrize("topics", [5, 1.5, {"a": 1}])
def test_subscriber_refuses_what_is_not_a_list_of_topics(
    broker: sqlbroker.Broker, topics: Any
) -> None:
    with pytest.raises(sqlbroker.InvalidOption) as caught:
        broker.subscriber("s", topics=topics)(lambda message: None)
    assert caught.value.field == "topics"


@pytest.mark.parametrize("ids", [0.0, 7, object()])
def test_dead_letter_ids_must_be_a_list(broker: sqlbroker.Broker, ids: Any) -> None:
    with pytest.raises(sqlbroker.InvalidOption) as caught:
        broker.dead_letters.replay(ids)
    assert caught.value.field == "ids"


@pytest.mark.parametrize("action", ["retry", "extend", "dead_letter"])
@pytest.mark.parametrize("count", [0, 2])
def test_single_delivery_calls_refuse_lists_of_other_sizes(
    broker: sqlbroker.Broker, action: str, count: int
) -> None:
    broker.send("q", 1)
    (delivery,) = broker.claim("q")
    options: dict[str, Any] = {"reason": "r"} if action == "dead_letter" else {}
    with pytest.raises(sqlbroker.InvalidOption) as caught:
        getattr(broker, action)([delivery] * count, **options)
    assert caught.value.field == "delivery"
    broker.complete(delivery)


@pytest.mark.parametrize("junk", [5, None, 1.5])
def test_complete_and_release_refuse_junk(broker: sqlbroker.Broker, junk: Any) -> None:
    for action in (broker.complete, broker.release):
        with pytest.raises(sqlbroker.InvalidOption) as caught:
            action(junk)
        assert caught.value.field == "deliveries"


def test_the_async_broker_refuses_batches_like_the_sync_one(backend_url: str) -> None:
    """``AsyncBroker`` turned any batch into a list first: ``None`` raised a ``TypeError``
    and a string was published as one message per character."""

    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            before = table_counts(broker.backend)
            for batch in (None, 5, "abc", {"topic": "t", "payload": 1}):
                with pytest.raises(sqlbroker.InvalidOption) as caught:
                    await broker.publish_many(batch)  # type: ignore[arg-type]
                assert caught.value.field == "messages"
                with pytest.raises(sqlbroker.InvalidOption) as caught:
                    await broker.send_many("q", batch)  # type: ignore[arg-type]
                assert caught.value.field == "messages"
            for junk in (5, None, "abc"):
                with pytest.raises(sqlbroker.InvalidOption) as caught:
                    await broker.complete(junk)  # type: ignore[arg-type]
                assert caught.value.field == "deliveries"
            assert table_counts(broker.backend) == before
            assert await broker.send_many("q", (p for p in [1, 2])) != []

    asyncio.run(scenario())
