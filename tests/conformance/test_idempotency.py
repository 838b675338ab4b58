"""Idempotent publish (DESIGN §2.6): a key is unique per topic within its dedupe window,
which outlives the message."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import sqlbroker
from helpers import claim_one, table_counts


def test_duplicate_returns_the_original_id_and_writes_nothing(broker: sqlbroker.Broker) -> None:
    broker.subscribe("sub", "orders.*")
    original = broker.publish("orders.created", {"id": 1}, idempotency_key="order-1")
    before = table_counts(broker.backend)
    assert broker.publish("orders.created", {"id": 1}, idempotency_key="order-1") == original
    assert table_counts(broker.backend) == before
    assert len(broker.claim("sub", limit=10)) == 1


def test_duplicate_send(broker: sqlbroker.Broker) -> None:
    original = broker.send("q", [1, 2], idempotency_key="k")
    before = table_counts(broker.backend)
    assert (
        broker.send("q", [1, 2], idempotency_key="k", priority=0, headers={"other": "options"})
        == original
    )
    assert table_counts(broker.backend) == before


def test_duplicate_after_the_message_finished(broker: sqlbroker.Broker) -> None:
    """The key outlives the message: completing it does not free the key."""
    original = broker.send("q", "once", idempotency_key="k")
    broker.complete(claim_one(broker, "q"))
    before = table_counts(broker.backend)
    assert broker.send("q", "once", idempotency_key="k") == original
    assert table_counts(broker.backend) == before
    assert broker.claim("q") == []


def test_duplicate_of_an_unrouted_publish(broker: sqlbroker.Broker) -> None:
    original = broker.publish("nobody", 1, idempotency_key="k")
    before = table_counts(broker.backend)
    assert broker.publish("nobody", 1, idempotency_key="k") == original
    assert table_counts(broker.backend) == before


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param({"payload": {"id": 1}}, {"payload": {"id": 2}}, id="other-json"),
        pytest.param(
            {"payload": {"a": 1, "b": 2}}, {"payload": {"b": 2, "a": 1}}, id="other-key-order"
        ),
        pytest.param({"payload": b"abc"}, {"payload": b"abd"}, id="other-bytes"),
        pytest.param(
            {"payload": b"abc", "content_type": "text/plain"},
            {"payload": b"abc", "content_type": "text/csv"},
            id="other-content-type",
        ),
        pytest.param({"payload": "abc"}, {"payload": b'"abc"'}, id="json-vs-bytes"),
    ],
)
def test_same_key_different_message_raises_conflict(
    broker: sqlbroker.Broker, first: dict[str, Any], second: dict[str, Any]
) -> None:
    original = broker.send("q", idempotency_key="k", **first)
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.IdempotencyConflict) as caught:
        broker.send("q", idempotency_key="k", **second)
    assert caught.value.message_id == original
    assert caught.value.idempotency_key == "k"
    assert caught.value.topic == "q"
    assert table_counts(broker.backend) == before


def test_keys_are_per_topic(broker: sqlbroker.Broker) -> None:
    broker.subscribe("all", "#")
    first = broker.publish("a", 1, idempotency_key="k")
    second = broker.publish("b", 2, idempotency_key="k")
    assert first != second
    assert [d.payload for d in broker.claim("all", limit=10)] == [1, 2]


def test_key_can_be_reused_after_the_window(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    original = clocked_broker.send("q", "v1", idempotency_key="k", dedupe_window=60)
    clock.advance(59)
    assert clocked_broker.send("q", "v1", idempotency_key="k", dedupe_window=60) == original
    with pytest.raises(sqlbroker.IdempotencyConflict):
        clocked_broker.send("q", "v2", idempotency_key="k", dedupe_window=60)
    clock.advance(1)
    reused = clocked_broker.send("q", "v2", idempotency_key="k", dedupe_window=60)
    assert reused != original
    assert [d.payload for d in clocked_broker.claim("q", limit=10)] == ["v1", "v2"]
    # The new reservation has a window of its own.
    clock.advance(30)
    assert clocked_broker.send("q", "v2", idempotency_key="k") == reused


def test_broker_default_dedupe_window(make_broker: Any, clock: sqlbroker.ManualClock) -> None:
    short = make_broker(dedupe_window=timedelta(minutes=5), clock=clock)
    original = short.send("q", 1, idempotency_key="k")
    clock.advance(timedelta(minutes=4, seconds=59))
    assert short.send("q", 1, idempotency_key="k") == original
    clock.advance(1)
    assert short.send("q", 1, idempotency_key="k") != original


def test_default_window_is_a_day(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    original = clocked_broker.send("q", 1, idempotency_key="k")
    clock.advance(timedelta(hours=23, minutes=59))
    assert clocked_broker.send("q", 1, idempotency_key="k") == original
    clock.advance(timedelta(minutes=1))
    assert clocked_broker.send("q", 1, idempotency_key="k") != original


def test_reap_trims_expired_keys(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", 1, idempotency_key="short", dedupe_window=10)
    clocked_broker.send("q", 2, idempotency_key="long", dedupe_window=1000)
    assert table_counts(clocked_broker.backend)["sqlbroker_dedupe"] == 2
    clock.advance(11)
    assert clocked_broker.reap()["dedupe_trimmed"] == 1
    assert table_counts(clocked_broker.backend)["sqlbroker_dedupe"] == 1
    assert clocked_broker.reap()["dedupe_trimmed"] == 0


def test_duplicates_inside_one_batch(broker: sqlbroker.Broker) -> None:
    ids = broker.publish_many(
        [
            {"topic": "nobody", "payload": 1, "idempotency_key": "k"},
            {"topic": "nobody", "payload": 2},
            {"topic": "nobody", "payload": 1, "idempotency_key": "k"},
        ]
    )
    assert ids[0] == ids[2]
    assert ids[1] != ids[0]
    assert table_counts(broker.backend)["sqlbroker_archive"] == 2


def test_conflict_inside_one_batch_writes_nothing(broker: sqlbroker.Broker) -> None:
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.IdempotencyConflict):
        broker.send_many("q", [1, 2], idempotency_key="same")
    assert table_counts(broker.backend) == before


def test_replayed_dead_letter_is_not_a_duplicate(broker: sqlbroker.Broker) -> None:
    original = broker.send("q", 1, idempotency_key="k")
    broker.dead_letter(claim_one(broker, "q"), reason="x")
    broker.dead_letters.replay(subscription="q")
    assert claim_one(broker, "q").message_id == original
    assert broker.send("q", 1, idempotency_key="k") == original
