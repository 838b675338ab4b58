"""Dead letters: what they keep, listing with filters, get, replay and purge, and the audit
trail of every replay and purge."""

from __future__ import annotations

from datetime import timedelta

import pytest

import sqlbroker
from helpers import assert_time, claim_one, now_of, table_counts


class AppError(Exception):
    pass


class OtherError(Exception):
    pass


def _kill(
    broker: sqlbroker.Broker, subscription: str, reason: str, error: BaseException | str | None
) -> None:
    broker.dead_letter(claim_one(broker, subscription), reason=reason, error=error)


@pytest.fixture
def populated(broker: sqlbroker.Broker) -> sqlbroker.Broker:
    """Four dead letters over two subscriptions, topics, error types and reasons."""
    broker.subscribe("billing", "orders.*")
    broker.subscribe("shipping", ["orders.paid", "returns.#"])
    broker.publish("orders.created", {"n": 1})  # billing only
    broker.publish("orders.paid", {"n": 2})  # billing and shipping
    broker.publish("returns.opened", {"n": 3})  # shipping only
    _kill(broker, "billing", "card declined", AppError("declined"))
    _kill(broker, "billing", "validation failed: amount", OtherError("amount"))
    _kill(broker, "shipping", "card declined twice", AppError("declined"))
    _kill(broker, "shipping", "no address", None)
    return broker


def test_list_all_oldest_first(populated: sqlbroker.Broker) -> None:
    dead = populated.dead_letters.list()
    assert [(d.subscription, d.topic, d.reason) for d in dead] == [
        ("billing", "orders.created", "card declined"),
        ("billing", "orders.paid", "validation failed: amount"),
        ("shipping", "orders.paid", "card declined twice"),
        ("shipping", "returns.opened", "no address"),
    ]
    assert [d.id for d in dead] == sorted(d.id for d in dead)


@pytest.mark.parametrize(
    ("filters", "expected_reasons"),
    [
        ({"subscription": "billing"}, ["card declined", "validation failed: amount"]),
        ({"subscription": "nobody"}, []),
        ({"topic": "orders.paid"}, ["validation failed: amount", "card declined twice"]),
        ({"error_type": f"{__name__}.AppError"}, ["card declined", "card declined twice"]),
        ({"error_type": "NoSuchError"}, []),
        ({"reason_contains": "declined"}, ["card declined", "card declined twice"]),
        ({"reason_contains": "%"}, []),
        ({"reason_contains": "_"}, []),
        ({"subscription": "shipping", "reason_contains": "declined"}, ["card declined twice"]),
        (
            {"topic": "orders.paid", "error_type": f"{__name__}.OtherError"},
            ["validation failed: amount"],
        ),
    ],
    ids=lambda value: (
        "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None
    ),
)
def test_list_filters(
    populated: sqlbroker.Broker, filters: dict[str, str], expected_reasons: list[str]
) -> None:
    assert [d.reason for d in populated.dead_letters.list(**filters)] == expected_reasons


def test_list_pages_with_limit_and_after_id(populated: sqlbroker.Broker) -> None:
    everything = populated.dead_letters.list()
    first_page = populated.dead_letters.list(limit=3)
    assert first_page == everything[:3]
    second_page = populated.dead_letters.list(limit=3, after_id=first_page[-1].id)
    assert second_page == everything[3:]


def test_list_by_dead_time(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    clocked_broker.send("q", "early")
    _kill(clocked_broker, "q", "early", None)
    clock.advance(60)
    boundary = now_of(clock)
    clocked_broker.send("q", "late")
    _kill(clocked_broker, "q", "late", None)
    assert [d.reason for d in clocked_broker.dead_letters.list(dead_before=boundary)] == ["early"]
    assert [d.reason for d in clocked_broker.dead_letters.list(dead_after=boundary)] == ["late"]


def test_get_and_not_found(populated: sqlbroker.Broker) -> None:
    first = populated.dead_letters.list()[0]
    assert populated.dead_letters.get(first.id) == first
    with pytest.raises(sqlbroker.NotFound):
        populated.dead_letters.get(first.id + 10_000)


def test_a_dead_letter_keeps_the_whole_message(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.subscribe("billing", "orders.#")
    enqueued = now_of(clock)
    message_id = clocked_broker.publish(
        "orders.created",
        {"order": 42, "items": ["a", "b"], "ü": "ß"},
        key="customer-1",
        priority=sqlbroker.HIGH,
        headers={"traceparent": "00-abc-def-01", "schema": "2"},
        idempotency_key="order-42",
        max_attempts=3,
    )
    clock.advance(5)
    first = claim_one(clocked_broker, "billing")
    started = now_of(clock)
    clocked_broker.retry(first, error=AppError("first failure"))
    first_failed = now_of(clock)
    clock.advance(10)
    second = claim_one(clocked_broker, "billing")
    clock.advance(1)

    try:
        raise AppError("x" * 12_000)  # a traceback far longer than the kept limit
    except AppError as error:
        clocked_broker.dead_letter(second, reason="gave up", error=error)
    dead_at = now_of(clock)

    (dead,) = clocked_broker.dead_letters.list()
    assert dead.message_id == message_id
    assert dead.subscription == "billing"
    assert dead.topic == "orders.created"
    assert dead.payload == {"order": 42, "items": ["a", "b"], "ü": "ß"}
    assert dead.content_type == "application/json"
    assert dead.headers == {"traceparent": "00-abc-def-01", "schema": "2"}
    assert dead.priority == sqlbroker.HIGH
    assert dead.key == "customer-1"
    assert dead.idempotency_key == "order-42"
    assert dead.attempts == 2
    assert dead.max_attempts == 3
    assert dead.replay_count == 0
    assert dead.reason == "gave up"
    assert dead.error_type == f"{__name__}.AppError"
    assert dead.error_message is not None
    assert dead.error_message == "x" * 2000
    assert dead.traceback is not None
    assert 1000 < len(dead.traceback) <= 8000 + len("…(truncated)\n")
    assert dead.traceback.startswith("…(truncated)")
    assert dead.traceback.rstrip().endswith("x" * 10)
    assert_time(dead.enqueued_at, enqueued)
    assert_time(dead.first_started_at, started)
    assert_time(dead.first_failed_at, first_failed)
    assert_time(dead.last_failed_at, dead_at)
    assert_time(dead.dead_at, dead_at)
    assert clocked_broker.archive() == []
    assert clocked_broker.pending() == []


def test_dead_letter_keeps_bytes_payloads(broker: sqlbroker.Broker) -> None:
    broker.send("q", b"\x00\xffraw", content_type="application/x-raw")
    _kill(broker, "q", "bad bytes", None)
    (dead,) = broker.dead_letters.list()
    assert dead.payload == b"\x00\xffraw"
    assert dead.content_type == "application/x-raw"
    assert dead.error_type is None
    assert dead.traceback is None


def test_dead_letter_with_a_string_error(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    _kill(broker, "q", "why", "it broke")
    (dead,) = broker.dead_letters.list()
    assert dead.error_message == "it broke"


def test_replay_by_id(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    message_id = clocked_broker.send("q", {"keep": ["me", 1]}, headers={"h": "v"}, max_attempts=2)
    for _ in range(2):
        clocked_broker.retry(claim_one(clocked_broker, "q"), error="fail")
    (dead,) = clocked_broker.dead_letters.list()
    assert dead.attempts == 2
    clock.advance(100)
    new_ids = clocked_broker.dead_letters.replay([dead.id], note="fixed the bug")
    assert len(new_ids) == 1
    assert clocked_broker.dead_letters.list() == []
    (pending,) = clocked_broker.pending("q")
    assert pending.id == new_ids[0]
    assert pending.state is sqlbroker.State.AVAILABLE
    assert pending.attempts == 0
    replayed = claim_one(clocked_broker, "q")
    assert replayed.id == new_ids[0]
    assert replayed.message_id == message_id
    assert replayed.attempt == 1
    assert replayed.replay_count == 1
    assert replayed.payload == {"keep": ["me", 1]}
    assert replayed.headers == {"h": "v"}
    assert replayed.max_attempts == 2
    clocked_broker.complete(replayed)
    (archived,) = clocked_broker.archive("q")
    assert archived.replay_count == 1
    assert archived.attempts == 1


def test_replay_twice_counts_both(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    for expected in (0, 1, 2):
        delivery = claim_one(broker, "q")
        assert delivery.replay_count == expected
        broker.dead_letter(delivery, reason="again")
        (dead,) = broker.dead_letters.list()
        assert dead.replay_count == expected
        broker.dead_letters.replay([dead.id])


def test_replay_by_filter(populated: sqlbroker.Broker) -> None:
    counts_before = table_counts(populated.backend)
    new_ids = populated.dead_letters.replay(reason_contains="declined")
    assert len(new_ids) == 2
    assert [d.reason for d in populated.dead_letters.list()] == [
        "validation failed: amount",
        "no address",
    ]
    billing = claim_one(populated, "billing")
    shipping = claim_one(populated, "shipping")
    assert (billing.topic, billing.payload, billing.replay_count, billing.attempt) == (
        "orders.created",
        {"n": 1},
        1,
        1,
    )
    assert (shipping.topic, shipping.payload, shipping.replay_count) == ("orders.paid", {"n": 2}, 1)
    counts_after = table_counts(populated.backend)
    assert counts_after["sqlbroker_dead"] == counts_before["sqlbroker_dead"] - 2
    assert counts_after["sqlbroker_message"] == counts_before["sqlbroker_message"] + 2
    assert counts_after["sqlbroker_audit"] == counts_before["sqlbroker_audit"] + 1


def test_replay_goes_back_to_its_subscription_only(broker: sqlbroker.Broker) -> None:
    broker.subscribe("a", "t")
    broker.subscribe("b", "t")
    broker.publish("t", "fan")
    _kill(broker, "a", "a failed", None)
    broker.dead_letters.replay(subscription="a")
    assert claim_one(broker, "a").replay_count == 1
    b_copy = claim_one(broker, "b")
    assert b_copy.replay_count == 0
    assert broker.claim("b") == []


def test_replay_after_unsubscribe_recreates_the_subscription(broker: sqlbroker.Broker) -> None:
    broker.send("jobs", 1)
    _kill(broker, "jobs", "bad", None)
    assert broker.unsubscribe("jobs") is True
    assert [d.subscription for d in broker.dead_letters.list()] == ["jobs"]
    (new_id,) = broker.dead_letters.replay(subscription="jobs")
    assert claim_one(broker, "jobs").id == new_id


def test_replay_nothing_matching_returns_empty(populated: sqlbroker.Broker) -> None:
    before = table_counts(populated.backend)
    assert populated.dead_letters.replay(subscription="nobody") == []
    assert table_counts(populated.backend) == before


def test_replay_and_purge_need_a_selector(populated: sqlbroker.Broker) -> None:
    before = table_counts(populated.backend)
    with pytest.raises(sqlbroker.ValidationError) as caught:
        populated.dead_letters.replay()
    assert caught.value.field == "ids"
    with pytest.raises(sqlbroker.ValidationError):
        populated.dead_letters.purge()
    with pytest.raises(sqlbroker.ValidationError) as caught:
        populated.dead_letters.replay(all=True, subscription="billing")
    assert caught.value.field == "all"
    assert table_counts(populated.backend) == before


def test_a_misspelt_filter_is_refused_and_changes_nothing(populated: sqlbroker.Broker) -> None:
    """The selection is one option group (``DeadSelection``): a keyword outside it is an
    ``InvalidOption`` naming it, on list, replay and purge alike."""
    before = table_counts(populated.backend)
    dead = populated.dead_letters
    for act in (dead.list, dead.replay, dead.purge):
        with pytest.raises(sqlbroker.InvalidOption) as caught:
            act(subscriptions="billing")  # type: ignore[call-arg]
        assert caught.value.field == "subscriptions"
    assert table_counts(populated.backend) == before


def test_replay_all(populated: sqlbroker.Broker) -> None:
    assert len(populated.dead_letters.replay(all=True)) == 4
    assert populated.dead_letters.list() == []
    assert len(populated.claim("billing", limit=10)) == 2
    assert len(populated.claim("shipping", limit=10)) == 2


def test_purge_by_id(populated: sqlbroker.Broker) -> None:
    first, *rest = populated.dead_letters.list()
    audit_before = table_counts(populated.backend)["sqlbroker_audit"]
    assert populated.dead_letters.purge([first.id], actor="ops:alice", note="junk") == 1
    assert populated.dead_letters.list() == rest
    with pytest.raises(sqlbroker.NotFound):
        populated.dead_letters.get(first.id)
    assert table_counts(populated.backend)["sqlbroker_audit"] == audit_before + 1
    assert populated.dead_letters.purge([first.id]) == 0


def test_purge_by_filter(populated: sqlbroker.Broker) -> None:
    assert populated.dead_letters.purge(subscription="shipping") == 2
    assert {d.subscription for d in populated.dead_letters.list()} == {"billing"}
    assert populated.dead_letters.purge(error_type=f"{__name__}.OtherError") == 1
    assert [d.reason for d in populated.dead_letters.list()] == ["card declined"]
    assert populated.dead_letters.purge(all=True) == 1
    assert populated.dead_letters.list() == []
    assert populated.pending() == []
    assert populated.archive() == []


def test_audit_rows_are_written_for_replay_and_purge(populated: sqlbroker.Broker) -> None:
    assert table_counts(populated.backend)["sqlbroker_audit"] == 0
    populated.dead_letters.replay(subscription="billing", actor="cli:bob")
    populated.dead_letters.purge(topic="returns.opened")
    assert table_counts(populated.backend)["sqlbroker_audit"] == 2


def test_stats_count_dead_letters(populated: sqlbroker.Broker) -> None:
    dead = {s.subscription: s.dead for s in populated.stats()}
    assert dead == {"billing": 2, "shipping": 2}


def test_replayed_message_has_no_leftover_ttl(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """A replay is an explicit decision to run the message again, even after its TTL."""
    clocked_broker.send("q", 1, ttl=30)
    _kill(clocked_broker, "q", "x", None)
    clock.advance(timedelta(minutes=5))
    clocked_broker.dead_letters.replay(subscription="q")
    assert claim_one(clocked_broker, "q").payload == 1


def test_an_empty_id_list_selects_nothing(populated: sqlbroker.Broker) -> None:
    """``ids=[]`` names no dead letters; it must never widen to "all of them"."""
    before = table_counts(populated.backend)
    assert populated.dead_letters.purge([]) == 0
    assert populated.dead_letters.replay([]) == []
    assert table_counts(populated.backend) == before


def test_unknown_ids_are_ignored(populated: sqlbroker.Broker) -> None:
    first = populated.dead_letters.list()[0]
    assert len(populated.dead_letters.replay([first.id, first.id + 10_000])) == 1
    assert populated.dead_letters.purge([first.id]) == 0
