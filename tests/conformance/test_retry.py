"""Retries: scheduled back-off, attempts counted at claim time, dead-lettering when the
attempts are spent (by a retry or by the reaper after a lost worker)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import sqlbroker
from helpers import assert_time, claim_one, now_of


def test_retry_without_delay_is_claimable_at_once(broker: sqlbroker.Broker) -> None:
    broker.send("q", "again")
    first = claim_one(broker, "q")
    broker.retry(first, error=ValueError("transient"))
    second = claim_one(broker, "q")
    assert second.id == first.id
    assert second.attempt == 2
    assert second.lease_token != first.lease_token
    assert second.payload == "again"


def test_retry_after_is_scheduled_until_the_clock_moves(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "backoff")
    first = claim_one(clocked_broker, "q")
    clocked_broker.retry(first, after=30, error="flaky downstream")
    (pending,) = clocked_broker.pending("q")
    assert pending.state is sqlbroker.State.SCHEDULED
    assert_time(pending.available_at, now_of(clock) + timedelta(seconds=30))
    assert pending.lease_expires_at is None
    assert pending.last_error is not None
    assert "flaky downstream" in pending.last_error
    assert clocked_broker.pending("q", state="scheduled") == [pending]
    assert clocked_broker.claim("q", limit=10) == []
    clock.advance(29)
    assert clocked_broker.claim("q", limit=10) == []
    clock.advance(1)
    second = claim_one(clocked_broker, "q")
    assert second.attempt == 2
    assert_time(second.available_at, now_of(clock))


def test_retry_after_timedelta(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", 1)
    clocked_broker.retry(claim_one(clocked_broker, "q"), after=timedelta(minutes=1))
    clock.advance(59)
    assert clocked_broker.claim("q") == []
    clock.advance(1)
    assert claim_one(clocked_broker, "q").attempt == 2


def test_attempt_counter_increments_per_claim(broker: sqlbroker.Broker) -> None:
    broker.send("q", "x", max_attempts=10)
    attempts = []
    for _ in range(4):
        delivery = claim_one(broker, "q")
        attempts.append(delivery.attempt)
        broker.retry(delivery)
    assert attempts == [1, 2, 3, 4]
    (pending,) = broker.pending("q")
    assert pending.attempts == 4
    assert pending.max_attempts == 10


def test_retry_when_attempts_are_spent_dead_letters(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    message_id = clocked_broker.send("q", {"order": 7}, max_attempts=3)
    first_failure = None
    for attempt in (1, 2):
        delivery = claim_one(clocked_broker, "q")
        assert delivery.attempt == attempt
        if first_failure is None:
            first_failure = now_of(clock)
        clocked_broker.retry(delivery, error=RuntimeError(f"failure {attempt}"))
        clock.advance(1)
    last = claim_one(clocked_broker, "q")
    assert last.attempt == last.max_attempts == 3
    clocked_broker.retry(last, after=60, error=RuntimeError("failure 3"))
    assert clocked_broker.pending("q") == []
    assert clocked_broker.claim("q") == []
    (dead,) = clocked_broker.dead_letters.list(subscription="q")
    assert dead.message_id == message_id
    assert "max attempts" in dead.reason
    assert dead.attempts == 3
    assert dead.max_attempts == 3
    assert dead.error_type == "RuntimeError"
    assert dead.error_message == "failure 3"
    assert dead.payload == {"order": 7}
    assert first_failure is not None
    assert_time(dead.first_failed_at, first_failure)
    assert_time(dead.last_failed_at, now_of(clock))
    assert_time(dead.dead_at, now_of(clock))


def test_reaping_an_expired_lease_on_the_last_attempt_dead_letters(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    message_id = clocked_broker.send("q", "poison", max_attempts=2)
    claim_one(clocked_broker, "q", lease=10)
    clock.advance(11)
    assert clocked_broker.reap() == {
        "released": 1,
        "dead": 0,
        "expired": 0,
        "unblocked": 0,
        "dedupe_trimmed": 0,
        "processed_trimmed": 0,
        "results_trimmed": 0,
        "sagas_swept": 0,
        "archive_trimmed": 0,
        "dead_trimmed": 0,
    }
    second = claim_one(clocked_broker, "q", lease=10)
    assert second.attempt == 2
    clock.advance(11)
    result = clocked_broker.reap()
    assert result["dead"] == 1
    assert result["released"] == 0
    assert clocked_broker.pending("q") == []
    (dead,) = clocked_broker.dead_letters.list()
    assert dead.message_id == message_id
    assert "worker lost" in dead.reason
    assert dead.attempts == 2
    assert_time(dead.dead_at, now_of(clock))


def test_a_message_that_kills_every_worker_is_quarantined(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """Attempts are counted at claim time, so crashes alone use them up (DESIGN §5)."""
    clocked_broker.send("q", "kills workers", max_attempts=3)
    for _ in range(3):
        claim_one(clocked_broker, "q", lease=5)
        clock.advance(6)
        clocked_broker.reap()
    assert clocked_broker.claim("q") == []
    (dead,) = clocked_broker.dead_letters.list()
    assert dead.attempts == 3
    assert "worker lost" in dead.reason


def test_max_attempts_one_dead_letters_on_the_first_retry(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1, max_attempts=1)
    broker.retry(claim_one(broker, "q"), error="nope")
    assert broker.claim("q") == []
    (dead,) = broker.dead_letters.list()
    assert dead.attempts == 1
    assert "max attempts" in dead.reason


def test_dead_letter_now(broker: sqlbroker.Broker) -> None:
    broker.send("q", {"bad": True}, max_attempts=5)
    delivery = claim_one(broker, "q")
    try:
        raise KeyError("missing field")
    except KeyError as error:
        broker.dead_letter(delivery, reason="unprocessable", error=error)
    assert broker.pending("q") == []
    (dead,) = broker.dead_letters.list()
    assert dead.reason == "unprocessable"
    assert dead.error_type == "KeyError"
    assert dead.error_message == "'missing field'"
    assert dead.traceback is not None
    assert "KeyError: 'missing field'" in dead.traceback
    assert dead.attempts == 1


def test_retry_keeps_the_message_fields(broker: sqlbroker.Broker) -> None:
    broker.send(
        "q", {"p": [1, 2]}, headers={"h": "1"}, priority=sqlbroker.LOW, key="k", max_attempts=4
    )
    first = claim_one(broker, "q")
    broker.retry(first)
    second = claim_one(broker, "q")
    for field in (
        "message_id",
        "payload",
        "headers",
        "priority",
        "key",
        "max_attempts",
        "enqueued_at",
        "topic",
    ):
        assert getattr(second, field) == getattr(first, field), field


@pytest.mark.parametrize("after", [0, 5])
def test_retried_message_stats(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, after: float
) -> None:
    clocked_broker.send("q", 1)
    clocked_broker.retry(claim_one(clocked_broker, "q"), after=after)
    stats = clocked_broker.stats()[0]
    assert (stats.ready, stats.scheduled, stats.running) == ((1, 0, 0) if after == 0 else (0, 1, 0))


def test_a_consumer_limit_above_the_message_limit_also_holds_for_lost_workers(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """A subscriber's ``RetryPolicy(max_attempts=4)`` retries a failing message 4 times
    whatever the message's own limit; a message whose worker dies must get as many
    attempts before the reaper quarantines it, not the message's 2."""
    clocked_broker.send("q", "kills workers", max_attempts=2)
    for attempt in range(1, 5):
        assert clocked_broker.dead_letters.list() == []
        (delivery,) = clocked_broker.backend.message_claim_many(
            subscription="q", limit=1, lease=5, worker="w", max_attempts=4
        )
        assert (delivery.attempt, delivery.max_attempts) == (attempt, 4)
        clock.advance(6)
        clocked_broker.reap()
    (dead,) = clocked_broker.dead_letters.list()
    assert dead.attempts == 4
    assert "worker lost" in dead.reason


def test_a_consumer_limit_lowers_the_message_limit_at_claim(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1, max_attempts=5)
    (delivery,) = broker.backend.message_claim_many(
        subscription="q", limit=1, lease=30, worker="w", max_attempts=2
    )
    assert delivery.max_attempts == 2
    broker.retry(delivery, after=0)
    (again,) = broker.claim("q")
    assert (again.attempt, again.max_attempts) == (2, 2)
