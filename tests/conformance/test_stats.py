"""stats(): per subscription ready, scheduled, running, dead and the oldest ready age."""

from __future__ import annotations

import pytest

import sqlbroker
from helpers import claim_one, stats_of


def test_stats_of_an_empty_broker(broker: sqlbroker.Broker) -> None:
    assert broker.stats() == []


def test_stats_of_an_idle_subscription(broker: sqlbroker.Broker) -> None:
    broker.subscribe("idle", "x")
    assert broker.stats() == [
        sqlbroker.SubscriptionStats(
            subscription="idle",
            ready=0,
            scheduled=0,
            running=0,
            blocked=0,
            dead=0,
            oldest_ready_age=None,
            archive_retention=7 * 86400.0,
            dead_retention=30 * 86400.0,
        )
    ]


def test_stats_counts_each_state(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send_many("q", [1, 2, 3, 4, 5, 6])
    clocked_broker.send("q", "later", delay=60)
    clocked_broker.send("other", "x")
    running = clocked_broker.claim("q", limit=3)
    clocked_broker.dead_letter(running[0], reason="bad")
    clocked_broker.retry(running[1], after=30)
    clock.advance(10)
    q = stats_of(clocked_broker, "q")
    assert (q.ready, q.scheduled, q.running, q.blocked, q.dead) == (3, 2, 1, 0, 1)
    assert q.oldest_ready_age == pytest.approx(10, abs=0.01)
    other = stats_of(clocked_broker, "other")
    assert (other.ready, other.scheduled, other.running, other.dead) == (1, 0, 0, 0)
    assert [s.subscription for s in clocked_broker.stats()] == ["other", "q"]


def test_oldest_ready_age_follows_the_clock(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "old")
    clock.advance(5)
    clocked_broker.send("q", "new")
    clock.advance(2.5)
    assert stats_of(clocked_broker, "q").oldest_ready_age == pytest.approx(7.5, abs=0.01)
    clocked_broker.complete(claim_one(clocked_broker, "q"))
    assert stats_of(clocked_broker, "q").oldest_ready_age == pytest.approx(2.5, abs=0.01)
    clocked_broker.complete(claim_one(clocked_broker, "q"))
    assert stats_of(clocked_broker, "q").oldest_ready_age is None


def test_running_messages_do_not_count_as_ready(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    claim_one(broker, "q")
    q = stats_of(broker, "q")
    assert (q.ready, q.running, q.oldest_ready_age) == (0, 1, None)


def test_a_delay_that_has_passed_counts_as_ready(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """Once its time has come a delayed message is ready work (consumer lag), even before
    any consumer has looked at the subscription."""
    clocked_broker.send("q", "delayed", delay=10)
    q = stats_of(clocked_broker, "q")
    assert (q.ready, q.scheduled, q.oldest_ready_age) == (0, 1, None)
    clock.advance(25)
    q = stats_of(clocked_broker, "q")
    assert (q.ready, q.scheduled) == (1, 0)
    assert q.oldest_ready_age == pytest.approx(15, abs=0.01)
    assert [p.state for p in clocked_broker.pending("q")] == [sqlbroker.State.AVAILABLE]


def test_stats_after_replay(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    broker.dead_letter(claim_one(broker, "q"), reason="x")
    assert stats_of(broker, "q").dead == 1
    broker.dead_letters.replay(subscription="q")
    q = stats_of(broker, "q")
    assert (q.ready, q.dead) == (1, 0)


def test_stats_keep_a_deleted_subscription_with_dead_letters(broker: sqlbroker.Broker) -> None:
    """Unsubscribing keeps the dead letters; stats still show them, on both backends."""
    broker.send("gone", 1)
    broker.dead_letter(claim_one(broker, "gone"), reason="bad")
    broker.subscribe("idle", "x")
    assert broker.unsubscribe("gone")
    assert [(s.subscription, s.ready, s.dead) for s in broker.stats()] == [
        ("gone", 0, 1),
        ("idle", 0, 0),
    ]
