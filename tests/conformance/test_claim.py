"""Claiming: priority order, limits, delays and TTLs (time moved by a ManualClock)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import sqlbroker
from helpers import assert_time, claim_one, now_of


def test_claim_from_an_empty_or_unknown_subscription_returns_nothing(
    broker: sqlbroker.Broker,
) -> None:
    assert broker.claim("nobody") == []
    broker.send("q", 1)
    claim_one(broker, "q")
    assert broker.claim("q", limit=10) == []


def test_claim_orders_by_priority_then_id(clocked_broker: sqlbroker.Broker) -> None:
    priorities = [5, 0, 9, 2, 0, 3, 1, 9, 2]
    ids = [clocked_broker.send("q", {"i": i}, priority=p) for i, p in enumerate(priorities)]
    deliveries = clocked_broker.claim("q", limit=100)
    expected = sorted(range(len(priorities)), key=lambda i: (priorities[i], i))
    assert [d.message_id for d in deliveries] == [ids[i] for i in expected]
    assert [d.priority for d in deliveries] == sorted(priorities)
    # Within a priority (same available_at under a stopped clock) the older id goes first.
    for first, second in itertools.pairwise(deliveries):
        if first.priority == second.priority:
            assert first.id < second.id


def test_claim_orders_by_available_at_within_a_priority(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    now = now_of(clock)
    late = clocked_broker.send("q", "late", at=now - timedelta(seconds=1))
    early = clocked_broker.send("q", "early", at=now - timedelta(seconds=30))
    current = clocked_broker.send("q", "current")
    middle = clocked_broker.send("q", "middle", at=now - timedelta(seconds=10))
    urgent_but_new = clocked_broker.send("q", "urgent", priority=sqlbroker.URGENT)
    deliveries = clocked_broker.claim("q", limit=10)
    assert [d.message_id for d in deliveries] == [urgent_but_new, early, middle, late, current]


def test_claim_one_at_a_time_follows_the_same_order(clocked_broker: sqlbroker.Broker) -> None:
    ids = {p: clocked_broker.send("q", p, priority=p) for p in (3, 1, 2, 0)}
    order = [claim_one(clocked_broker, "q").message_id for _ in range(4)]
    assert order == [ids[0], ids[1], ids[2], ids[3]]


@pytest.mark.parametrize("limit", [1, 3, 7])
def test_claim_respects_limit(broker: sqlbroker.Broker, limit: int) -> None:
    broker.send_many("q", list(range(5)))
    first = broker.claim("q", limit=limit)
    assert len(first) == min(limit, 5)
    rest = broker.claim("q", limit=100)
    assert len(first) + len(rest) == 5
    assert {d.id for d in first}.isdisjoint(d.id for d in rest)
    assert sorted(d.payload for d in first + rest) == list(range(5))


def test_claim_limit_maximum_is_accepted(broker: sqlbroker.Broker) -> None:
    broker.send_many("q", list(range(1200)))
    assert len(broker.claim("q", limit=1000)) == 1000
    assert len(broker.claim("q", limit=1000)) == 200


def test_claim_sets_a_lease(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    clocked_broker.send("q", 1)
    clocked_broker.send("q", 2)
    first, second = clocked_broker.claim("q", limit=2, lease=12.5)
    now = now_of(clock)
    assert_time(first.lease_expires_at, now + timedelta(seconds=12.5))
    assert first.lease_token != second.lease_token
    third_message = clocked_broker.send("q", 3)
    default = claim_one(clocked_broker, "q")
    assert default.message_id == third_message
    assert_time(default.lease_expires_at, now + timedelta(seconds=clocked_broker.lease))


def test_claim_reports_times(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    sent_at = now_of(clock)
    clocked_broker.send("q", 1, ttl=3600)
    clock.advance(7)
    delivery = claim_one(clocked_broker, "q")
    assert_time(delivery.enqueued_at, sent_at)
    assert_time(delivery.available_at, sent_at)
    assert delivery.expires_at is not None
    assert_time(delivery.expires_at, sent_at + timedelta(hours=1))


def test_delay_is_not_claimable_before_its_time(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    start = now_of(clock)
    delayed = clocked_broker.send("q", "later", delay=10)
    assert clocked_broker.claim("q", limit=10) == []
    clock.advance(9.9)
    assert clocked_broker.claim("q", limit=10) == []
    clock.advance(0.1)
    delivery = claim_one(clocked_broker, "q")
    assert delivery.message_id == delayed
    assert_time(delivery.available_at, start + timedelta(seconds=10))


def test_delay_as_timedelta(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    clocked_broker.send("q", "later", delay=timedelta(minutes=2))
    clock.advance(119)
    assert clocked_broker.claim("q") == []
    clock.advance(1)
    assert claim_one(clocked_broker, "q").payload == "later"


def test_at_schedules_for_a_point_in_time(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    when = now_of(clock) + timedelta(seconds=30)
    scheduled = clocked_broker.send("q", "at", at=when)
    clocked_broker.send("q", "now", priority=sqlbroker.LOW)
    assert [d.payload for d in clocked_broker.claim("q", limit=10)] == ["now"]
    clock.advance(29)
    assert clocked_broker.claim("q", limit=10) == []
    clock.advance(1)
    delivery = claim_one(clocked_broker, "q")
    assert delivery.message_id == scheduled
    assert_time(delivery.available_at, when)


def test_at_in_another_timezone_is_the_same_instant(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    when = (now_of(clock) + timedelta(seconds=30)).astimezone(
        timezone(timedelta(hours=5, minutes=30))
    )
    clocked_broker.send("q", "tz", at=when)
    clock.advance(29.9)
    assert clocked_broker.claim("q") == []
    clock.advance(0.1)
    delivery = claim_one(clocked_broker, "q")
    assert_time(delivery.available_at, when.astimezone(UTC))


def test_at_in_the_past_is_claimable_at_once(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "overdue", at=now_of(clock) - timedelta(days=1))
    assert claim_one(clocked_broker, "q").payload == "overdue"


def test_already_expired_at_publish_is_never_delivered(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "too late", expires_at=now_of(clock) - timedelta(seconds=1))
    assert clocked_broker.claim("q", limit=10) == []
    assert clocked_broker.reap()["expired"] == 1
    assert [a.outcome for a in clocked_broker.archive("q")] == [sqlbroker.Outcome.EXPIRED]


def test_delayed_messages_join_the_priority_order_when_due(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "low-now", priority=sqlbroker.LOW)
    clocked_broker.send("q", "urgent-later", priority=sqlbroker.URGENT, delay=5)
    clock.advance(5)
    assert [d.payload for d in clocked_broker.claim("q", limit=10)] == ["urgent-later", "low-now"]


def test_expired_message_is_never_claimed_and_reap_archives_it(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    sent_at = now_of(clock)
    expiring = clocked_broker.send("q", "short-lived", ttl=5)
    kept = clocked_broker.send("q", "kept")
    clock.advance(5)
    claimed = clocked_broker.claim("q", limit=10)
    assert [d.message_id for d in claimed] == [kept]
    assert clocked_broker.claim("q", limit=10) == []
    clocked_broker.complete(claimed)
    result = clocked_broker.reap()
    assert result["expired"] == 1
    (archived,) = clocked_broker.archive("q", outcome="expired")
    assert archived.message_id == expiring
    assert archived.outcome is sqlbroker.Outcome.EXPIRED
    assert archived.attempts == 0
    assert archived.payload == "short-lived"
    assert archived.first_started_at is None
    assert_time(archived.enqueued_at, sent_at)
    assert_time(archived.finished_at, sent_at + timedelta(seconds=5))
    assert clocked_broker.pending("q") == []


def test_ttl_not_yet_passed_is_claimable(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", 1, ttl=5)
    clock.advance(4.9)
    assert claim_one(clocked_broker, "q").payload == 1


def test_expires_at_is_honoured(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", 1, expires_at=now_of(clock) + timedelta(seconds=60))
    clock.advance(61)
    assert clocked_broker.claim("q") == []
    assert clocked_broker.reap()["expired"] == 1
    assert [a.outcome for a in clocked_broker.archive("q")] == [sqlbroker.Outcome.EXPIRED]


def test_delayed_message_with_ttl_is_claimable_between(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "window", delay=10, ttl=20)
    clock.advance(10)
    assert claim_one(clocked_broker, "q").payload == "window"


def test_delayed_message_that_expires_before_a_claim_is_never_delivered(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "missed", delay=10, ttl=20)
    clock.advance(25)
    assert clocked_broker.claim("q", limit=10) == []
    assert clocked_broker.reap()["expired"] == 1
    assert [a.outcome for a in clocked_broker.archive("q")] == [sqlbroker.Outcome.EXPIRED]


def test_running_message_is_not_expired_under_its_worker(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """A TTL stops delivery; it does not pull a message out from under a running handler."""
    clocked_broker.send("q", 1, ttl=5)
    delivery = claim_one(clocked_broker, "q", lease=60)
    clock.advance(10)
    assert clocked_broker.reap()["expired"] == 0
    clocked_broker.complete(delivery)
    assert [a.outcome for a in clocked_broker.archive("q")] == [sqlbroker.Outcome.COMPLETED]


def test_claim_is_per_subscription(broker: sqlbroker.Broker) -> None:
    broker.send("a", "for-a")
    broker.send("b", "for-b")
    assert [d.payload for d in broker.claim("a", limit=10)] == ["for-a"]
    assert [d.payload for d in broker.claim("b", limit=10)] == ["for-b"]


def test_worker_name_is_recorded(broker: sqlbroker.Broker) -> None:
    assert ":" in sqlbroker.Broker.worker_name()
    broker.send("q", 1)
    claim_one(broker, "q", worker="worker-7")
    (pending,) = broker.pending("q")
    assert pending.state is sqlbroker.State.RUNNING
    assert pending.attempts == 1
    assert pending.lease_expires_at is not None


@pytest.mark.postgres
def test_times_are_utc_whatever_the_database_time_zone(pg_server: Any, pg_url: str) -> None:
    """sqlbroker's connections read times in UTC even where the database's default zone is
    another (here half an hour off UTC): the same instants, as ``datetime.UTC``."""
    database = conninfo_to_dict(pg_url)["dbname"]
    pg_server.execute(f"ALTER DATABASE {database} SET TimeZone = 'Asia/Kolkata'")
    with psycopg.connect(pg_url) as plain:
        assert plain.execute("SHOW TimeZone").fetchone() == ("Asia/Kolkata",)
    with sqlbroker.Broker(pg_url) as broker:
        sent = datetime.now(UTC)
        near = timedelta(seconds=5)
        broker.send("q", "tz", ttl=60)
        delivery = claim_one(broker, "q")
        times = [delivery.enqueued_at, delivery.available_at, delivery.lease_expires_at]
        assert all(time.tzinfo is UTC for time in [*times, delivery.expires_at])
        assert_time(delivery.enqueued_at, sent, tolerance=near)
        assert_time(delivery.expires_at, sent + timedelta(seconds=60), tolerance=near)
        broker.complete(delivery)
        (archived,) = broker.archive("q")
        assert_time(archived.finished_at, datetime.now(UTC), tolerance=near)
        # psycopg returns datetime.UTC itself, which the claim's rows take without converting.
        with broker.backend.begin() as conn_tx:
            conn = conn_tx.connection
            assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
