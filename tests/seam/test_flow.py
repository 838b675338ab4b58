"""Flow limits on the seam, both dialects: the claim statement obeys a subscription's
concurrency caps (total and per key), its rate limits (GCRA, on the test clock) and its
fairness; the settings read back; a subscription without limits claims as before."""

from __future__ import annotations

from typing import Any

from tests.seam.support import claim, new_message, publish

from helpers import table_counts
from sqlbroker.core.clock import ManualClock
from sqlbroker.core.flow import Claimed, FlowLimits, Rate, flow_limits
from sqlbroker.core.settlements import Lease, Settlement


def limit(backend: Any, name: str, **options: object) -> None:
    assert backend.flow_set(name=name, limits=flow_limits(options))


def complete(backend: Any, deliveries: list[Any]) -> None:
    backend.message_settle_many(settlements=[Settlement.complete(Lease.of(d)) for d in deliveries])


def test_max_running_caps_the_copies_running_across_claims(backend: Any) -> None:
    publish(backend, "jobs", 10)
    limit(backend, "jobs", max_running=3)
    first = claim(backend, "jobs", 2)
    second = claim(backend, "jobs", 5)
    assert (len(first), len(second)) == (2, 1)
    assert claim(backend, "jobs", 5) == []
    complete(backend, first)
    assert len(claim(backend, "jobs", 5)) == 2
    (flow,) = backend.flow_list(name="jobs")
    assert (flow.running, flow.at_cap, flow.throttled) == (3, True, True)


def test_an_expired_lease_gives_its_slot_back_once_released(
    backend: Any, clock: ManualClock
) -> None:
    publish(backend, "jobs", 3)
    limit(backend, "jobs", max_running=1)
    assert len(claim(backend, "jobs", 5)) == 1
    clock.advance(31)
    assert claim(backend, "jobs", 5) == []  # the lost worker's copy still counts
    backend.lease_release_expired(limit=10)
    assert len(claim(backend, "jobs", 5)) == 1


def test_key_concurrency_runs_up_to_n_copies_of_a_key(backend: Any) -> None:
    publish(backend, "jobs", 5, key="a")
    publish(backend, "jobs", 1, key="b")
    publish(backend, "jobs", 2)
    limit(backend, "jobs", key_concurrency=2)
    got = claim(backend, "jobs", 10)
    keys = sorted(str(d.key) for d in got)
    assert keys == ["None", "None", "a", "a", "b"]
    assert claim(backend, "jobs", 10) == []
    complete(backend, [d for d in got if d.key == "a"][:1])
    (again,) = claim(backend, "jobs", 10)
    assert again.key == "a"


def test_without_key_concurrency_a_key_still_runs_one_at_a_time(backend: Any) -> None:
    publish(backend, "jobs", 3, key="a")
    limit(backend, "jobs", max_running=10)
    assert [d.key for d in claim(backend, "jobs", 10)] == ["a"]


def test_rate_limit_spaces_claims_on_the_clock(backend: Any, clock: ManualClock) -> None:
    publish(backend, "jobs", 10)
    limit(backend, "jobs", rate_limit="2/s")  # one every 0.5 s, two at once
    assert len(claim(backend, "jobs", 10)) == 2
    assert claim(backend, "jobs", 10) == []
    (flow,) = backend.flow_list(name="jobs")
    assert flow.throttled
    assert 0.4 < flow.throttled_for <= 0.5
    clock.advance(0.5)
    assert len(claim(backend, "jobs", 10)) == 1
    clock.advance(10)
    assert len(claim(backend, "jobs", 10)) == 2  # a quiet spell saves one second's worth


def test_key_rate_limit_holds_each_key_to_its_rate(backend: Any, clock: ManualClock) -> None:
    publish(backend, "jobs", 3, key="a")
    publish(backend, "jobs", 3, key="b")
    limit(backend, "jobs", key_concurrency=10, key_rate_limit="1/min")
    assert sorted(str(d.key) for d in claim(backend, "jobs", 10)) == ["a", "b"]
    clock.advance(30)
    assert claim(backend, "jobs", 10) == []
    clock.advance(30)
    assert len(claim(backend, "jobs", 10)) == 2


def test_fair_takes_the_keys_in_turn(backend: Any) -> None:
    backend.message_insert_many(
        messages=[new_message("jobs", {"n": n}, key="noisy") for n in range(200)],
        subscription="jobs",
    )
    publish(backend, "jobs", 1, key="quiet")
    publish(backend, "jobs", 50)
    limit(backend, "jobs", fair=True, key_concurrency=1000)
    first = claim(backend, "jobs", 3)
    assert sorted(str(d.key) for d in first) == ["None", "noisy", "quiet"]


def test_limits_read_back_and_reset(backend: Any) -> None:
    publish(backend, "jobs", 1)
    limits = FlowLimits(max_running=4, key_concurrency=2, rate_limit=Rate(100, 60.0), fair=True)
    assert backend.flow_set(name="jobs", limits=limits)
    (flow,) = backend.flow_list(name="jobs")
    assert (flow.subscription, flow.limits) == ("jobs", limits)
    assert backend.flow_set(name="jobs", limits=FlowLimits())
    (flow,) = backend.flow_list(name="jobs")
    assert flow.limits == FlowLimits()
    assert len(claim(backend, "jobs", 5)) == 1


def test_an_unknown_subscription_is_not_found_and_nothing_is_written(backend: Any) -> None:
    before = table_counts(backend)
    assert not backend.flow_set(name="nope", limits=FlowLimits(max_running=1))
    assert table_counts(backend) == before
    assert backend.flow_list(name="nope") == []


def test_a_throttled_claim_says_when_the_next_is_due(backend: Any, clock: ManualClock) -> None:
    publish(backend, "jobs", 3)
    publish(backend, "plain", 1)
    limit(backend, "jobs", rate_limit="1/min")
    first = claim(backend, "jobs", 10)
    assert isinstance(first, Claimed)
    assert len(first) == 1
    assert first.wait is not None
    assert 59 < first.wait <= 60
    held = claim(backend, "jobs", 10)
    assert held == []
    assert isinstance(held, Claimed)
    assert held.wait is not None
    assert 59 < held.wait <= 60
    clock.advance(45)
    held = claim(backend, "jobs", 10)
    assert held.wait is not None
    assert 14 < held.wait <= 15
    limit(backend, "jobs", max_running=1)  # a cap is waited out by polling: no wait
    clock.advance(60)
    assert getattr(claim(backend, "jobs", 10), "wait", None) is None
    # A subscription without limits claims through the plain statement alone.
    assert not isinstance(claim(backend, "plain", 10), Claimed)


def test_a_paused_flow_limited_subscription_claims_nothing(backend: Any) -> None:
    publish(backend, "jobs", 3, key="a")
    publish(backend, "jobs", 3)
    limit(backend, "jobs", fair=True, key_concurrency=2)
    assert len(claim(backend, "jobs", 1)) == 1  # known flow-limited from now on
    backend.subscription_pause(name="jobs", paused=True, actor="test", note=None)
    assert claim(backend, "jobs", 10) == []
    backend.subscription_pause(name="jobs", paused=False, actor="test", note=None)
    assert sorted(str(d.key) for d in claim(backend, "jobs", 10)) == ["None"] * 3 + ["a"]
