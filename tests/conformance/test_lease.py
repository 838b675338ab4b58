"""Leases: every claim issues a token; a stale token fails loudly (LeaseLost) and changes
nothing; extend pushes the expiry; release gives a claim back without counting it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

import sqlbroker
from helpers import assert_time, claim_one, now_of, table_counts


def _stale_and_fresh(
    broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, lease: float = 10
) -> tuple[sqlbroker.Delivery, sqlbroker.Delivery]:
    """Claim, let the lease expire, reap, claim again: the first delivery is stale."""
    stale = claim_one(broker, "q", lease=lease)
    clock.advance(lease + 1)
    assert broker.reap()["released"] == 1
    fresh = claim_one(broker, "q", lease=lease)
    assert fresh.id == stale.id
    assert fresh.lease_token != stale.lease_token
    assert fresh.attempt == stale.attempt + 1
    return stale, fresh


def test_complete_with_a_stale_token_raises_and_changes_nothing(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "work")
    stale, fresh = _stale_and_fresh(clocked_broker, clock)
    before = table_counts(clocked_broker.backend)
    pending_before = clocked_broker.pending("q")
    with pytest.raises(sqlbroker.LeaseLost) as caught:
        clocked_broker.complete(stale)
    assert caught.value.delivery_ids == (stale.id,)
    assert table_counts(clocked_broker.backend) == before
    assert clocked_broker.pending("q") == pending_before
    assert clocked_broker.archive("q") == []
    # The current holder still owns it.
    clocked_broker.complete(fresh)
    (archived,) = clocked_broker.archive("q")
    assert archived.outcome is sqlbroker.Outcome.COMPLETED
    assert archived.attempts == 2


STALE_OPERATIONS: dict[str, Callable[[sqlbroker.Broker, sqlbroker.Delivery], object]] = {
    "extend": lambda broker, stale: broker.extend(stale, lease=300),
    "retry": lambda broker, stale: broker.retry(stale, error=RuntimeError("boom")),
    "retry-later": lambda broker, stale: broker.retry(stale, after=60),
    "dead_letter": lambda broker, stale: broker.dead_letter(stale, reason="stale"),
    "release": lambda broker, stale: broker.release(stale),
}


@pytest.mark.parametrize("operation", sorted(STALE_OPERATIONS))
def test_other_operations_with_a_stale_token_raise_and_change_nothing(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, operation: str
) -> None:
    clocked_broker.send("q", "work")
    stale, fresh = _stale_and_fresh(clocked_broker, clock)
    before = table_counts(clocked_broker.backend)
    pending_before = clocked_broker.pending("q")
    with pytest.raises(sqlbroker.LeaseLost) as caught:
        STALE_OPERATIONS[operation](clocked_broker, stale)
    assert caught.value.delivery_ids == (stale.id,)
    assert str(stale.id) in str(caught.value)
    assert table_counts(clocked_broker.backend) == before
    assert clocked_broker.pending("q") == pending_before
    clocked_broker.complete(fresh)


def test_retry_on_the_last_attempt_with_a_stale_token_raises(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """On the last attempt retry turns into a dead-letter; that path checks the token too."""
    clocked_broker.send("q", "work", max_attempts=3)
    stale, fresh = _stale_and_fresh(clocked_broker, clock)
    clocked_broker.retry(fresh)
    last = claim_one(clocked_broker, "q")
    assert last.attempt == 3
    stale_last = last
    clock.advance(clocked_broker.lease + 1)
    # The last attempt expires: the reaper dead-letters it; the holder's retry then fails.
    assert clocked_broker.reap()["dead"] == 1
    before = table_counts(clocked_broker.backend)
    with pytest.raises(sqlbroker.LeaseLost):
        clocked_broker.retry(stale_last)
    assert table_counts(clocked_broker.backend) == before
    assert stale.attempt == 1


def test_complete_of_a_batch_with_one_stale_delivery(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "will-go-stale", priority=sqlbroker.URGENT)
    stale, fresh = _stale_and_fresh(clocked_broker, clock)
    clocked_broker.send_many("q", ["a", "b", "c"])
    others = clocked_broker.claim("q", limit=10)
    assert len(others) == 3
    with pytest.raises(sqlbroker.LeaseLost) as caught:
        clocked_broker.complete([others[0], stale, others[1], others[2]])
    assert caught.value.delivery_ids == (stale.id,)
    completed = clocked_broker.archive("q", outcome="completed")
    assert sorted(a.message_id for a in completed) == sorted(d.message_id for d in others)
    assert sorted(a.payload for a in completed) == ["a", "b", "c"]
    (still_running,) = clocked_broker.pending("q")
    assert still_running.id == fresh.id
    assert still_running.state is sqlbroker.State.RUNNING


def test_completing_twice_raises_lease_lost(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    delivery = claim_one(broker, "q")
    broker.complete(delivery)
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.LeaseLost):
        broker.complete(delivery)
    assert table_counts(broker.backend) == before


def test_forged_token_is_refused(broker: sqlbroker.Broker) -> None:
    from dataclasses import replace

    broker.send("q", 1)
    delivery = claim_one(broker, "q")
    before = table_counts(broker.backend)
    for token in ("0" * 32, "00000000-0000-4000-8000-000000000000", "not-a-token", "", "'; --"):
        forged = replace(delivery, lease_token=token)
        with pytest.raises(sqlbroker.LeaseLost):
            broker.complete(forged)
        with pytest.raises(sqlbroker.LeaseLost):
            broker.extend(forged)
        with pytest.raises(sqlbroker.LeaseLost):
            broker.retry(forged)
    unknown = replace(delivery, id=delivery.id + 1000)
    with pytest.raises(sqlbroker.LeaseLost) as caught:
        broker.complete(unknown)
    assert caught.value.delivery_ids == (delivery.id + 1000,)
    assert table_counts(broker.backend) == before
    broker.complete(delivery)


def test_extend_pushes_the_expiry(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "long job")
    delivery = claim_one(clocked_broker, "q", lease=10)
    clock.advance(8)
    new_expiry = clocked_broker.extend(delivery, lease=30)
    assert_time(new_expiry, now_of(clock) + timedelta(seconds=30))
    (pending,) = clocked_broker.pending("q")
    assert_time(pending.lease_expires_at, new_expiry)
    # Past the original expiry, but inside the extended one: the reaper leaves it alone.
    clock.advance(20)
    assert clocked_broker.reap()["released"] == 0
    assert clocked_broker.claim("q") == []
    default_expiry = clocked_broker.extend(delivery)
    assert_time(default_expiry, now_of(clock) + timedelta(seconds=clocked_broker.lease))
    clocked_broker.complete(delivery)
    assert clocked_broker.pending("q") == []


def test_without_extend_the_lease_expires_and_the_message_is_redelivered(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    message_id = clocked_broker.send("q", "crashy")
    first = claim_one(clocked_broker, "q", lease=10)
    clock.advance(9)
    assert clocked_broker.reap()["released"] == 0
    clock.advance(1)
    assert clocked_broker.reap()["released"] == 1
    again = claim_one(clocked_broker, "q")
    assert again.message_id == message_id
    assert again.attempt == first.attempt + 1 == 2
    (pending,) = clocked_broker.pending("q")
    assert pending.last_error is not None


def test_release_returns_a_claim_without_counting_the_attempt(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send_many("q", [1, 2])
    claimed = clocked_broker.claim("q", limit=2)
    assert [d.attempt for d in claimed] == [1, 1]
    clocked_broker.release(claimed)
    stats = clocked_broker.stats()[0]
    assert (stats.ready, stats.running) == (2, 0)
    assert {p.attempts for p in clocked_broker.pending("q")} == {0}
    again = clocked_broker.claim("q", limit=2)
    assert [d.attempt for d in again] == [1, 1]
    assert [d.id for d in again] == [d.id for d in claimed]
    with pytest.raises(sqlbroker.LeaseLost):
        clocked_broker.release(claimed[0])
    clocked_broker.complete(again)


def test_release_keeps_the_place_in_line(broker: sqlbroker.Broker) -> None:
    broker.send("q", "first")
    broker.send("q", "second")
    first = claim_one(broker, "q")
    broker.release(first)
    assert [d.payload for d in broker.claim("q", limit=2)] == ["first", "second"]


def test_release_with_one_stale_delivery_releases_the_others(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "stale-one", priority=sqlbroker.URGENT)
    stale, fresh = _stale_and_fresh(clocked_broker, clock)
    clocked_broker.send("q", "other")
    other = claim_one(clocked_broker, "q")
    with pytest.raises(sqlbroker.LeaseLost) as caught:
        clocked_broker.release([stale, other])
    assert caught.value.delivery_ids == (stale.id,)
    states = {p.id: p.state for p in clocked_broker.pending("q")}
    assert states == {fresh.id: sqlbroker.State.RUNNING, other.id: sqlbroker.State.AVAILABLE}


def test_lease_lost_lists_every_stale_id(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send_many("q", [1, 2, 3])
    claimed = clocked_broker.claim("q", limit=3, lease=5)
    clock.advance(6)
    assert clocked_broker.reap()["released"] == 3
    with pytest.raises(sqlbroker.LeaseLost) as caught:
        clocked_broker.complete(claimed)
    assert caught.value.delivery_ids == tuple(sorted(d.id for d in claimed))
