"""The archive: completed, expired, cancelled and unrouted copies with their attempts and
times; cancel(message_id)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import sqlbroker
from helpers import assert_time, claim_one, now_of, table_counts


def test_completed_row(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    enqueued = now_of(clock)
    message_id = clocked_broker.send("q", {"done": True}, headers={"h": "1"}, priority=1, key="k")
    clock.advance(2)
    first = claim_one(clocked_broker, "q")
    started = now_of(clock)
    clocked_broker.retry(first)
    clock.advance(3)
    second = claim_one(clocked_broker, "q")
    clock.advance(4)
    clocked_broker.complete(second)
    (row,) = clocked_broker.archive("q")
    assert row.message_id == message_id
    assert row.subscription == "q"
    assert row.topic == "q"
    assert row.outcome is sqlbroker.Outcome.COMPLETED
    assert row.payload == {"done": True}
    assert row.content_type == "application/json"
    assert row.headers == {"h": "1"}
    assert row.priority == 1
    assert row.key == "k"
    assert row.attempts == 2
    assert row.replay_count == 0
    assert_time(row.enqueued_at, enqueued)
    assert_time(row.first_started_at, started)
    assert_time(row.finished_at, now_of(clock))
    assert clocked_broker.pending("q") == []


def test_expired_row(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    enqueued = now_of(clock)
    clocked_broker.send("q", "stale", ttl=10)
    clock.advance(15)
    assert clocked_broker.reap()["expired"] == 1
    (row,) = clocked_broker.archive("q")
    assert row.outcome is sqlbroker.Outcome.EXPIRED
    assert row.attempts == 0
    assert row.first_started_at is None
    assert_time(row.enqueued_at, enqueued)
    assert_time(row.finished_at, now_of(clock))


def test_expired_after_a_retry_keeps_its_attempts(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    enqueued = now_of(clock)
    clocked_broker.send("q", "x", ttl=10)
    clocked_broker.retry(claim_one(clocked_broker, "q"), after=60)
    clock.advance(61)
    assert clocked_broker.claim("q") == []
    assert clocked_broker.reap()["expired"] == 1
    (row,) = clocked_broker.archive("q", outcome=sqlbroker.Outcome.EXPIRED)
    assert row.attempts == 1
    assert_time(row.first_started_at, enqueued)


def test_cancelled_rows(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    clocked_broker.subscribe("a", "t")
    clocked_broker.subscribe("b", "t")
    clocked_broker.subscribe("c", "t")
    message_id = clocked_broker.publish("t", "cancel me")
    other = clocked_broker.publish("t", "keep me")
    running = claim_one(clocked_broker, "a")
    assert running.message_id == message_id
    clocked_broker.retry(claim_one(clocked_broker, "b"), after=100)  # scheduled copies cancel too
    clock.advance(1)
    # Two copies cancelled, and the running one flagged for its worker (none here).
    assert clocked_broker.cancel(message_id) == 3
    rows = clocked_broker.archive(outcome="cancelled")
    assert sorted(r.subscription or "" for r in rows) == ["b", "c"]
    for row in rows:
        assert row.message_id == message_id
        assert_time(row.finished_at, now_of(clock))
    assert {r.subscription: r.attempts for r in rows} == {"b": 1, "c": 0}
    # The running copy is left to its worker; the other message is untouched.
    assert [
        (p.subscription, p.message_id)
        for p in clocked_broker.pending()
        if p.message_id == message_id
    ] == [("a", message_id)]
    assert len([p for p in clocked_broker.pending() if p.message_id == other]) == 3
    clocked_broker.complete(running)
    assert clocked_broker.cancel(message_id) == 0


def test_cancel_unknown_message_is_zero(broker: sqlbroker.Broker) -> None:
    before = table_counts(broker.backend)
    assert broker.cancel("00000000-0000-7000-8000-000000000000") == 0
    assert table_counts(broker.backend) == before


def test_cancelled_message_is_never_claimed(broker: sqlbroker.Broker) -> None:
    message_id = broker.send("q", 1, delay=60)
    assert broker.cancel(message_id) == 1
    assert broker.claim("q", limit=10) == []
    assert broker.pending() == []


def test_unrouted_row(clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> None:
    message_id = clocked_broker.publish(
        "nobody.listens", {"lost": False}, headers={"x": "y"}, priority=0
    )
    (row,) = clocked_broker.archive(outcome="unrouted")
    assert row.message_id == message_id
    assert row.subscription is None
    assert row.topic == "nobody.listens"
    assert row.payload == {"lost": False}
    assert row.headers == {"x": "y"}
    assert row.priority == 0
    assert row.attempts == 0
    assert row.first_started_at is None
    assert_time(row.enqueued_at, now_of(clock))
    assert_time(row.finished_at, now_of(clock))
    assert clocked_broker.pending() == []


def test_archive_filters_and_order(broker: sqlbroker.Broker) -> None:
    broker.send("a", 1)
    broker.send("b", 2)
    broker.complete(broker.claim("a") + broker.claim("b"))
    lost = broker.publish("nobody", 3)
    rows = broker.archive()
    assert [r.payload for r in rows] == [3, 2, 1], "newest first"
    assert [r.payload for r in broker.archive("a")] == [1]
    assert [r.payload for r in broker.archive(outcome="completed")] == [2, 1]
    assert [r.payload for r in broker.archive(message_id=lost)] == [3]
    assert [r.payload for r in broker.archive(limit=1)] == [3]


@pytest.mark.parametrize("delay", [timedelta(0), timedelta(seconds=30)])
def test_every_copy_ends_somewhere(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, delay: timedelta
) -> None:
    """DESIGN §2.2: completed, dead, expired or cancelled — never gone."""
    ids = [
        clocked_broker.send("q", i, delay=delay, ttl=delay.total_seconds() + 10) for i in range(4)
    ]
    clock.advance(delay)
    done, dead, _ = clocked_broker.claim("q", limit=3)
    clocked_broker.complete(done)
    clocked_broker.dead_letter(dead, reason="bad")
    clocked_broker.cancel(ids[3])
    clock.advance(20)  # the third copy's lease is still valid; its TTL passes
    assert clocked_broker.reap()["expired"] == 0
    clock.advance(clocked_broker.lease)
    clocked_broker.reap()
    assert clocked_broker.claim("q") == []
    clocked_broker.reap()
    outcomes = {a.message_id: a.outcome.value for a in clocked_broker.archive("q")}
    outcomes.update({d.message_id: "dead" for d in clocked_broker.dead_letters.list()})
    assert sorted(outcomes) == sorted(ids)
    assert sorted(outcomes.values()) == ["cancelled", "completed", "dead", "expired"]


def test_without_archive_completed_an_ack_only_deletes(
    make_broker: Any, clock: sqlbroker.ManualClock
) -> None:
    """``archive_completed=False``: a completed copy leaves no archive row (acks get
    cheaper); expired and cancelled copies are archived as before, and a stale ack is
    still refused."""
    broker = make_broker(archive_completed=False, clock=clock)
    done = broker.send("q", "done")
    cancelled = broker.send("q", "cancelled", delay=60)
    expired = broker.send("q", "expired", ttl=5, priority=sqlbroker.LOW)
    delivery = claim_one(broker, "q")
    assert delivery.message_id == done
    broker.complete(delivery)
    with pytest.raises(sqlbroker.LeaseLost):
        broker.complete(delivery)
    assert broker.cancel(cancelled) == 1
    clock.advance(10)
    assert broker.reap()["expired"] == 1
    outcomes = {row.message_id: row.outcome for row in broker.archive("q")}
    assert outcomes == {
        cancelled: sqlbroker.Outcome.CANCELLED,
        expired: sqlbroker.Outcome.EXPIRED,
    }
    assert broker.pending("q") == []


def test_without_archive_completed_the_next_copy_of_a_key_follows(make_broker: Any) -> None:
    broker = make_broker(archive_completed=False)
    first, second = (broker.send("q", i, key="k") for i in range(2))
    head = claim_one(broker, "q")
    assert head.message_id == first
    assert broker.claim("q") == []
    broker.complete(head)
    assert claim_one(broker, "q").message_id == second


def test_without_archive_completed_a_worker_drains_the_queue(make_broker: Any) -> None:
    broker = make_broker(archive_completed=False)
    seen: list[int] = []

    @broker.subscriber(queue="q", concurrency=2)
    def handle(message: sqlbroker.Message) -> None:
        seen.append(message.payload)

    broker.send_many("q", list(range(20)))
    broker.run_until_idle(timeout=30)
    assert sorted(seen) == list(range(20))
    assert broker.pending("q") == []
    assert broker.archive("q") == []


@pytest.mark.parametrize("value", ["no", 0, None])
def test_archive_completed_takes_a_bool(backend_url: str, value: object) -> None:
    with pytest.raises(sqlbroker.InvalidOption, match=r"archive_completed.*True or False"):
        sqlbroker.Broker(backend_url, archive_completed=value)
