"""Delayed copies become claimable without a promotion statement before every claim."""

from __future__ import annotations

from datetime import timedelta

import sqlbroker
from sqlbroker.core.clock import ManualClock


def test_a_due_delayed_copy_is_claimed_right_after_a_claim_that_found_nothing(
    clocked_broker: sqlbroker.Broker, clock: ManualClock
) -> None:
    clocked_broker.send("jobs", {"n": 1}, delay=timedelta(seconds=30))
    assert clocked_broker.claim("jobs") == []
    clock.advance(30)
    [delivery] = clocked_broker.claim("jobs")
    assert delivery.payload == {"n": 1}
