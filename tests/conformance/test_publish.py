"""Publishing and sending: ids, queues created on use, batches in one transaction, and
payloads and headers that come back exactly as they went in."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest

import sqlbroker
from helpers import claim_one, table_counts


def test_publish_and_send_return_distinct_message_ids(broker: sqlbroker.Broker) -> None:
    broker.subscribe("audit", "orders.#")
    published = broker.publish("orders.created", {"n": 1})
    sent = broker.send("emails", {"n": 2})
    for message_id in (published, sent):
        assert isinstance(message_id, str)
        uuid.UUID(message_id)  # a UUID in text form
    assert published != sent
    assert claim_one(broker, "audit").message_id == published
    assert claim_one(broker, "emails").message_id == sent


def test_message_ids_are_unique_uuid7_with_a_time_prefix(broker: sqlbroker.Broker) -> None:
    ids = [broker.send("q", i) for i in range(20)]
    assert len(set(ids)) == 20
    assert all(uuid.UUID(i).version == 7 for i in ids)
    # The leading 48 bits are Unix milliseconds: ids sort by time across milliseconds (the
    # order within one millisecond is random, which RFC 9562 allows).
    millis = [uuid.UUID(i).int >> 80 for i in ids]
    assert millis == sorted(millis)


def test_send_creates_the_queue_on_first_use(broker: sqlbroker.Broker) -> None:
    assert broker.subscriptions() == []
    broker.send("emails", {"to": "a@example.com"})
    (queue,) = broker.subscriptions()
    assert queue.name == "emails"
    assert queue.patterns == ("emails",)
    broker.send("emails", {"to": "b@example.com"})
    assert [s.name for s in broker.subscriptions()] == ["emails"]
    counts = table_counts(broker.backend)
    assert counts["sqlbroker_subscription"] == 1
    assert counts["sqlbroker_message"] == 2


def test_send_goes_only_to_its_queue(broker: sqlbroker.Broker) -> None:
    broker.subscribe("everything", "#")
    broker.send("emails", {"x": 1})
    assert broker.claim("everything", limit=10) == []
    assert claim_one(broker, "emails").payload == {"x": 1}


def test_publish_many_returns_ids_in_order(broker: sqlbroker.Broker) -> None:
    broker.subscribe("all", "#")
    ids = broker.publish_many(
        [
            {"topic": "a", "payload": 1},
            {"topic": "b.c", "payload": 2, "priority": sqlbroker.NORMAL},
            {"topic": "d", "payload": 3, "headers": {"h": "v"}},
        ]
    )
    assert len(ids) == 3
    assert len(set(ids)) == 3
    deliveries = broker.claim("all", limit=10)
    assert [(d.message_id, d.topic, d.payload) for d in deliveries] == [
        (ids[0], "a", 1),
        (ids[1], "b.c", 2),
        (ids[2], "d", 3),
    ]
    assert deliveries[2].headers == {"h": "v"}


def test_empty_batches_write_nothing(broker: sqlbroker.Broker) -> None:
    before = table_counts(broker.backend)
    assert broker.publish_many([]) == []
    assert broker.send_many("q", []) == []
    assert table_counts(broker.backend) == before


def test_send_many_shares_options(broker: sqlbroker.Broker) -> None:
    ids = broker.send_many(
        "q", [{"i": i} for i in range(5)], priority=sqlbroker.HIGH, headers={"k": "v"}
    )
    deliveries = broker.claim("q", limit=10)
    assert [d.message_id for d in deliveries] == ids
    assert [d.payload for d in deliveries] == [{"i": i} for i in range(5)]
    assert {d.priority for d in deliveries} == {sqlbroker.HIGH}
    assert all(d.headers == {"k": "v"} for d in deliveries)


@pytest.mark.parametrize("bad_index", [0, 3, 9])
def test_publish_many_with_one_invalid_item_writes_nothing(
    broker: sqlbroker.Broker, bad_index: int
) -> None:
    broker.subscribe("all", "#")
    before = table_counts(broker.backend)
    batch: list[dict[str, Any]] = [{"topic": "t", "payload": i} for i in range(10)]
    batch[bad_index] = {"topic": "t", "payload": math.nan}
    with pytest.raises(sqlbroker.InvalidPayload) as caught:
        broker.publish_many(batch)
    assert caught.value.field == f"messages[{bad_index}].payload"
    assert table_counts(broker.backend) == before


def test_send_many_with_one_invalid_item_writes_nothing(broker: sqlbroker.Broker) -> None:
    broker.send("q", "first")
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.InvalidPayload) as caught:
        broker.send_many("q", [1, 2, {"bad": {1, 2}}, 4])
    assert caught.value.field == "messages[2].payload"
    assert table_counts(broker.backend) == before


def test_publish_many_is_one_transaction_when_the_database_refuses_an_item(
    broker: sqlbroker.Broker,
) -> None:
    """An idempotency conflict is found by the database mid-batch: the whole batch rolls back."""
    broker.subscribe("all", "#")
    broker.publish("t", {"v": 1}, idempotency_key="k1")
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.IdempotencyConflict):
        broker.publish_many(
            [
                {"topic": "t", "payload": {"v": 10}},
                {"topic": "u", "payload": {"v": 11}},
                {"topic": "t", "payload": {"v": 2}, "idempotency_key": "k1"},
            ]
        )
    assert table_counts(broker.backend) == before


JSON_PAYLOADS = [
    pytest.param(None, id="null"),
    pytest.param(True, id="true"),
    pytest.param(False, id="false"),
    pytest.param(0, id="zero"),
    pytest.param(-(2**63), id="int64-min"),
    pytest.param(2**64 + 1, id="beyond-int64"),
    pytest.param(1.0, id="float-one"),
    pytest.param(0.1, id="float-tenth"),
    pytest.param(-1.5e-300, id="tiny-float"),
    pytest.param(1.7976931348623157e308, id="max-float"),
    pytest.param("", id="empty-string"),
    pytest.param("héllo wörld ✓ 日本語 🎉 \u200b", id="unicode"),
    pytest.param('quotes " and \\ backslash \n newline \t tab', id="escapes"),
    pytest.param([], id="empty-list"),
    pytest.param({}, id="empty-object"),
    pytest.param({"b": 1, "a": 2, "c": {"z": None, "y": [1, "two", 3.0]}}, id="key-order"),
    pytest.param({"ü": "ß", "emoji 🎉": ["🎉"]}, id="unicode-keys"),
    pytest.param([[[[["deep"]]]]], id="nested"),
    pytest.param({"n": 1, "f": 1.0, "neg": -0.5, "big": 10**30}, id="number-kinds"),
]


@pytest.mark.parametrize("payload", JSON_PAYLOADS)
def test_json_payload_round_trip(broker: sqlbroker.Broker, payload: Any) -> None:
    broker.send("q", payload)
    delivery = claim_one(broker, "q")
    assert delivery.content_type == "application/json"
    assert delivery.payload == payload
    assert _shape(delivery.payload) == _shape(payload), (
        "types (int vs float) and key order must survive"
    )


def _shape(value: Any) -> Any:
    """A value's structure with types and key order made explicit."""
    if isinstance(value, dict):
        return ("dict", [(key, _shape(item)) for key, item in value.items()])
    if isinstance(value, list | tuple):
        return ("list", [_shape(item) for item in value])
    return (type(value).__name__, value)


def test_tuple_payload_comes_back_as_a_list(broker: sqlbroker.Broker) -> None:
    broker.send("q", (1, (2, "x")))
    assert claim_one(broker, "q").payload == [1, [2, "x"]]


@pytest.mark.parametrize(
    ("payload", "content_type", "expected_type"),
    [
        pytest.param(
            b"\x00\x01\xff binary \x00", None, "application/octet-stream", id="bytes-default"
        ),
        pytest.param(b"\x89PNG\r\n\x1a\n", "image/png", "image/png", id="bytes-png"),
        pytest.param(
            bytearray(b"abc"),
            "text/plain; charset=utf-8",
            "text/plain; charset=utf-8",
            id="bytearray",
        ),
        pytest.param(memoryview(b"mv"), None, "application/octet-stream", id="memoryview"),
        pytest.param(b"", "application/x-empty", "application/x-empty", id="empty-bytes"),
        pytest.param(
            bytes(range(256)) * 64, None, "application/octet-stream", id="all-byte-values"
        ),
    ],
)
def test_bytes_payload_round_trip(
    broker: sqlbroker.Broker, payload: Any, content_type: str | None, expected_type: str
) -> None:
    broker.send("q", payload, content_type=content_type)
    delivery = claim_one(broker, "q")
    assert delivery.content_type == expected_type
    assert isinstance(delivery.payload, bytes)
    assert delivery.payload == bytes(payload)


def test_payload_at_exactly_the_limit_is_accepted(make_broker: Any) -> None:
    limited = make_broker(payload_limit=100)
    limited.send("q", "x" * 98)  # 98 characters + 2 quotes = 100 bytes
    limited.send("q", b"y" * 100)
    assert [len(d.payload) for d in limited.claim("q", limit=2)] == [98, 100]


def test_default_payload_limit_is_256_kib(broker: sqlbroker.Broker) -> None:
    broker.send("q", "x" * (256 * 1024 - 2))
    assert len(claim_one(broker, "q").payload) == 256 * 1024 - 2


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(
            {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            id="traceparent",
        ),
        pytest.param({"correlation-id": "abc", "schema-version": "3", "empty": ""}, id="several"),
        pytest.param({"x-unicode": "ünïcødé ✓ 🎉", "x-quote": "a'b\"c\\d"}, id="unicode-values"),
    ],
)
def test_headers_round_trip(broker: sqlbroker.Broker, headers: dict[str, str]) -> None:
    broker.send("q", {}, headers=headers)
    assert claim_one(broker, "q").headers == headers


def test_no_headers_come_back_as_an_empty_dict(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    broker.send("q", 2, headers={})
    assert [d.headers for d in broker.claim("q", limit=2)] == [{}, {}]


def test_delivery_carries_the_message_fields(broker: sqlbroker.Broker) -> None:
    message_id = broker.send(
        "q",
        {"a": 1},
        priority=sqlbroker.HIGH,
        key="customer-7",
        idempotency_key="idem-1",
        max_attempts=7,
    )
    delivery = claim_one(broker, "q")
    assert delivery.message_id == message_id
    assert delivery.subscription == "q"
    assert delivery.topic == "q"
    assert delivery.priority == sqlbroker.HIGH
    assert delivery.key == "customer-7"
    assert delivery.idempotency_key == "idem-1"
    assert delivery.max_attempts == 7
    assert delivery.attempt == 1
    assert delivery.replay_count == 0
    assert delivery.expires_at is None
    assert isinstance(delivery.lease_token, str)
    assert delivery.lease_token


def test_default_max_attempts_comes_from_the_broker(make_broker: Any) -> None:
    custom = make_broker(max_attempts=3)
    custom.send("q", 1)
    assert claim_one(custom, "q").max_attempts == 3


def test_send_after_unsubscribe_recreates_the_queue(broker: sqlbroker.Broker) -> None:
    """ "Created on first use" holds again after the queue was deleted: a message is never
    left in a subscription that does not exist."""
    broker.send("jobs", 1)
    assert broker.unsubscribe("jobs") is True
    broker.send("jobs", 2)
    assert [(s.name, s.patterns) for s in broker.subscriptions()] == [("jobs", ("jobs",))]
    assert [d.payload for d in broker.claim("jobs", limit=10)] == [2]


def test_queue_deleted_by_another_broker_is_recreated(make_broker: Any) -> None:
    first, second = make_broker(), make_broker()
    first.send("jobs", 1)
    second.unsubscribe("jobs")
    first.send_many("jobs", [2, 3])
    assert [s.name for s in second.subscriptions()] == ["jobs"]
    assert [d.payload for d in second.claim("jobs", limit=10)] == [2, 3]


def test_known_queue_deleted_by_another_broker_is_recreated_by_a_single_send(
    make_broker: Any,
) -> None:
    """A queue the broker saw exist (its second send found it) skips the creation on later
    single sends: deleted meanwhile by another broker, it is created again, pattern and all."""
    first, second = make_broker(), make_broker()
    first.send("jobs", 1)
    first.send("jobs", 2)
    second.unsubscribe("jobs")
    first.send("jobs", 3)
    first.send("jobs", 4)
    assert [(s.name, s.patterns) for s in second.subscriptions()] == [("jobs", ("jobs",))]
    assert [d.payload for d in second.claim("jobs", limit=10)] == [3, 4]


def test_publish_listeners_hear_committed_publishes_only(broker: sqlbroker.Broker) -> None:
    """In-process wake-ups: a listener hears each committed publish (the queue for a send,
    None for a routed publish); see test_outbox for publishes on the caller's connection."""
    heard: list[str | None] = []
    broker.add_publish_listener(heard.append)
    broker.send("q", 1)
    broker.send_many("q", [2, 3])
    broker.publish("orders.x", 4)
    broker.publish_many([{"topic": "orders.y", "payload": 5}])
    assert heard == ["q", "q", None, None]
    broker.remove_publish_listener(heard.append)
    broker.send("q", 6)
    assert len(heard) == 4
