"""The broker's limits (issue 29, item 6; docs/guarantees.md, "Limits"): the same errors
on both backends, naming the limit and the Broker option that raises it, and nothing
written when one is passed."""

from __future__ import annotations

import pytest

import sqlbroker
from helpers import table_counts


def counts(broker: sqlbroker.Broker) -> dict[str, int]:
    found = table_counts(broker.backend)
    return {name: found[name] for name in sorted(found) if "spark" not in name}


def test_copies_per_publish_call(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True, max_copies=5) as broker:
        for name in ("a", "b", "c"):
            broker.subscribe(name, ["orders.#"])
        before = counts(broker)
        with pytest.raises(sqlbroker.LimitExceeded) as refused:
            broker.publish_many([{"topic": "orders.new", "payload": n} for n in range(2)])
        assert refused.value.field == "max_copies"
        assert refused.value.limit == 5
        assert refused.value.wanted > 5
        assert "Broker(max_copies=...)" in str(refused.value)
        with pytest.raises(sqlbroker.LimitExceeded, match="max_copies"):
            broker.send_many("jobs", list(range(6)))
        with pytest.raises(sqlbroker.LimitExceeded, match="max_copies"):
            broker.publish_many(
                [{"topic": "orders.new", "payload": n, "idempotency_key": f"k{n}"} for n in (1, 2)]
            )
        assert counts(broker) == before
        # At the limit, and a duplicate that writes nothing, pass.
        broker.publish("orders.new", 1, idempotency_key="k1")
        broker.publish("orders.new", 1, idempotency_key="k1")
        broker.send_many("jobs", list(range(5)))
        assert len(broker.pending()) == 3 + 5


def test_patterns_per_subscription(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("wide", [f"a{n}.#" for n in range(60)])
        with pytest.raises(sqlbroker.LimitExceeded) as refused:
            broker.subscribe("wide", [f"b{n}.#" for n in range(60)])
        assert refused.value.field == "patterns"
        assert refused.value.wanted == 120
        (wide,) = broker.subscriptions()
        assert len(wide.patterns) == 60
        broker.subscribe("wide", [f"b{n}.#" for n in range(60)], replace=True)
        assert {p[0] for p in broker.subscriptions()[0].patterns} == {"b"}


def test_subscriptions_and_patterns_per_database(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True, max_subscriptions=3, max_patterns=4) as broker:
        broker.subscribe("one", ["x.#"])
        broker.send("two", 1)
        broker.subscribe("three", ["y.#", "z.#"])
        before = counts(broker)
        with pytest.raises(sqlbroker.LimitExceeded) as refused:
            broker.subscribe("four", ["w.#"])
        assert refused.value.field == "max_subscriptions"
        assert "Broker(max_subscriptions=...)" in str(refused.value)
        with pytest.raises(sqlbroker.LimitExceeded, match="max_subscriptions"):
            broker.send("five", 1)
        with pytest.raises(sqlbroker.LimitExceeded, match="max_patterns"):
            broker.subscribe("one", ["v.#"])
        assert counts(broker) == before
        assert sorted(s.name for s in broker.subscriptions()) == ["one", "three", "two"]
        broker.send("two", 2)  # an existing queue is no new subscription
        broker.unsubscribe("one")
        broker.send("five", 1)


def test_limits_are_validated() -> None:
    for option in ("max_copies", "max_subscriptions", "max_patterns"):
        with pytest.raises(sqlbroker.InvalidOption, match=option):
            sqlbroker.Broker("sqlite:///:memory:", **{option: 0})


def test_a_single_publish_past_max_copies_writes_nothing(backend_url: str) -> None:
    """One routed message whose fan-out passes ``max_copies`` is refused by its own insert
    (no count beforehand): nothing written, an idempotency key not taken."""
    with sqlbroker.Broker(backend_url, migrate=True, max_copies=2) as broker:
        for name in ("a", "b", "c"):
            broker.subscribe(name, ["orders.#"])
        before = counts(broker)
        with pytest.raises(sqlbroker.LimitExceeded) as refused:
            broker.publish("orders.new", 1, idempotency_key="k1")
        assert (refused.value.field, refused.value.limit, refused.value.wanted) == (
            "max_copies",
            2,
            3,
        )
        assert counts(broker) == before
        broker.unsubscribe("c")
        broker.publish("orders.new", 2, idempotency_key="k1")  # the key was not taken
        assert len(broker.pending()) == 2
