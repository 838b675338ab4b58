"""Pub/sub: wildcard subscriptions, fan-out on write, no retroactive delivery, unrouted."""

from __future__ import annotations

import pytest

import sqlbroker
from helpers import claim_one, table_counts


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("orders.created", ["orders.created"], ["orders", "orders.created.eu", "orders.paid"]),
        (
            "orders.*",
            ["orders.created", "orders.paid"],
            ["orders", "orders.created.eu", "users.created"],
        ),
        (
            "*.created",
            ["orders.created", "users.created"],
            ["created", "a.b.created", "orders.paid"],
        ),
        (
            "orders.#",
            ["orders", "orders.created", "orders.created.eu.west"],
            ["users.created", "ordersx"],
        ),
        (
            "#.created",
            ["created", "orders.created", "a.b.created"],
            ["orders.created.eu", "orders"],
        ),
        ("a.#.z", ["a.z", "a.b.z", "a.b.c.z"], ["a", "z", "a.z.b"]),
        ("*.*", ["a.b"], ["a", "a.b.c"]),
        ("#", ["a", "a.b", "a.b.c.d"], []),
        ("a.*.#", ["a.b", "a.b.c"], ["a", "b.c"]),
        ("Orders-v2.foo_bar", ["Orders-v2.foo_bar"], ["orders-v2.foo_bar", "Orders-v2.foo-bar"]),
    ],
)
def test_patterns_route_like_amqp(
    broker: sqlbroker.Broker, pattern: str, matching: list[str], not_matching: list[str]
) -> None:
    subscription = broker.subscribe("sub", pattern)
    assert subscription.patterns == (pattern,)
    for topic in matching + not_matching:
        broker.publish(topic, topic)
    got = [d.payload for d in broker.claim("sub", limit=100)]
    assert got == matching
    unrouted = sorted(a.topic for a in broker.archive(outcome="unrouted"))
    assert unrouted == sorted(not_matching)


def test_fan_out_gives_each_subscription_its_own_copy(broker: sqlbroker.Broker) -> None:
    broker.subscribe("billing", "orders.*")
    broker.subscribe("audit", "#")
    broker.subscribe("eu", ["orders.#", "eu.#"])
    broker.subscribe("users", "users.*")
    message_id = broker.publish("orders.created", {"id": 1})
    copies = {name: claim_one(broker, name) for name in ("billing", "audit", "eu")}
    assert broker.claim("users") == []
    assert {d.message_id for d in copies.values()} == {message_id}
    assert len({d.id for d in copies.values()}) == 3, "each copy is its own delivery"
    assert all(d.payload == {"id": 1} for d in copies.values())
    assert {d.subscription for d in copies.values()} == {"billing", "audit", "eu"}
    # Each copy lives its own life: retry one, dead-letter one, complete one.
    broker.retry(copies["billing"])
    broker.dead_letter(copies["audit"], reason="audit down")
    broker.complete(copies["eu"])
    assert claim_one(broker, "billing").attempt == 2
    assert [d.subscription for d in broker.dead_letters.list()] == ["audit"]
    assert [a.subscription for a in broker.archive(outcome="completed")] == ["eu"]


def test_a_subscription_matching_twice_gets_one_copy(broker: sqlbroker.Broker) -> None:
    broker.subscribe("sub", ["orders.*", "#", "orders.created"])
    broker.publish("orders.created", 1)
    assert len(broker.claim("sub", limit=10)) == 1


def test_a_subscription_created_after_a_publish_does_not_receive_it(
    broker: sqlbroker.Broker,
) -> None:
    broker.subscribe("early", "t")
    broker.publish("t", "before")
    broker.subscribe("late", "t")
    broker.publish("t", "after")
    assert [d.payload for d in broker.claim("early", limit=10)] == ["before", "after"]
    assert [d.payload for d in broker.claim("late", limit=10)] == ["after"]


def test_unrouted_publish_is_archived(broker: sqlbroker.Broker) -> None:
    broker.subscribe("sub", "orders.*")
    message_id = broker.publish("users.created", {"u": 1})
    assert broker.pending() == []
    (row,) = broker.archive(outcome=sqlbroker.Outcome.UNROUTED)
    assert row.message_id == message_id
    assert row.topic == "users.created"
    counts = table_counts(broker.backend)
    assert counts["sqlbroker_message"] == 0
    assert counts["sqlbroker_archive"] == 1


def test_subscribe_adds_and_replace_sets_patterns(broker: sqlbroker.Broker) -> None:
    first = broker.subscribe("sub", "a.*")
    assert first.name == "sub"
    assert first.patterns == ("a.*",)
    added = broker.subscribe("sub", ["b.#", "a.*"])
    assert sorted(added.patterns) == ["a.*", "b.#"]
    assert added.created_at == first.created_at
    replaced = broker.subscribe("sub", "c", replace=True)
    assert replaced.patterns == ("c",)
    broker.publish("a.x", 1)
    broker.publish("c", 2)
    assert [d.payload for d in broker.claim("sub", limit=10)] == [2]


def test_subscriptions_list(broker: sqlbroker.Broker) -> None:
    broker.subscribe("b", ["x", "y.*"])
    broker.subscribe("a", "#")
    broker.send("q", 1)
    listed = {s.name: sorted(s.patterns) for s in broker.subscriptions()}
    assert listed == {"a": ["#"], "b": ["x", "y.*"], "q": ["q"]}


def test_unsubscribe_deletes_pending_copies(broker: sqlbroker.Broker) -> None:
    broker.subscribe("gone", "t")
    broker.subscribe("kept", "t")
    broker.publish("t", 1)
    assert broker.unsubscribe("gone") is True
    assert broker.unsubscribe("gone") is False
    assert [s.name for s in broker.subscriptions()] == ["kept"]
    assert [p.subscription for p in broker.pending()] == ["kept"]
    broker.publish("t", 2)
    assert [d.payload for d in broker.claim("kept", limit=10)] == [1, 2]


def test_publish_to_a_queue_name_reaches_the_queue(broker: sqlbroker.Broker) -> None:
    """A queue is a subscription whose only pattern is its name: publish reaches it too."""
    broker.send("emails", "sent")
    broker.publish("emails", "published")
    assert [d.payload for d in broker.claim("emails", limit=10)] == ["sent", "published"]


def test_send_to_an_existing_subscription_keeps_its_patterns(broker: sqlbroker.Broker) -> None:
    broker.subscribe("workers", "jobs.#")
    broker.send("workers", "direct")
    (sub,) = broker.subscriptions()
    assert "jobs.#" in sub.patterns
    broker.publish("jobs.resize", "routed")
    assert [d.payload for d in broker.claim("workers", limit=10)] == ["direct", "routed"]


def test_publish_many_routes_each_message(broker: sqlbroker.Broker) -> None:
    broker.subscribe("o", "orders.*")
    broker.subscribe("u", "users.*")
    broker.publish_many(
        [
            {"topic": "orders.a", "payload": 1},
            {"topic": "users.b", "payload": 2},
            {"topic": "none", "payload": 3},
            {"topic": "orders.c", "payload": 4},
        ]
    )
    assert [d.payload for d in broker.claim("o", limit=10)] == [1, 4]
    assert [d.payload for d in broker.claim("u", limit=10)] == [2]
    assert [a.payload for a in broker.archive(outcome="unrouted")] == [3]
