"""Delayed copies become claimable without a promotion statement before every claim."""

from __future__ import annotations

from datetime import timedelta

import sqlbroker
from sqlbroker.core.clock import ManualClock
from sqlbroker.storage.promotion import PromotionThrottle


def test_the_throttle_promotes_once_per_interval() -> None:
    now = [100.0]
    throttle = PromotionThrottle(0.05, monotonic=lambda: now[0])
    assert throttle.due("jobs", None)
    assert not throttle.due("jobs", None)
    assert throttle.due("other", None)
    now[0] += 0.06
    assert throttle.due("jobs", None)


def test_an_injected_clock_moving_forward_or_back_promotes_at_once() -> None:
    throttle = PromotionThrottle(0.05, monotonic=lambda: 0.0)
    assert throttle.due("jobs", 1000.0)
    assert not throttle.due("jobs", 1000.01)
    assert throttle.due("jobs", 1001.0)
    assert throttle.due("jobs", 900.0)
    assert throttle.due("jobs", None)


def test_a_due_delayed_copy_is_claimed_right_after_a_claim_that_found_nothing(
    clocked_broker: sqlbroker.Broker, clock: ManualClock
) -> None:
    clocked_broker.send("jobs", {"n": 1}, delay=timedelta(seconds=30))
    assert clocked_broker.claim("jobs") == []
    clock.advance(30)
    [delivery] = clocked_broker.claim("jobs")
    assert delivery.payload == {"n": 1}
