"""The promotion throttle: when a claim first promotes its subscription's due delayed
copies (the broker-level behaviour: tests/conformance/test_promotion.py)."""

from __future__ import annotations

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
