"""Processed keys (``broker.once``): consumer-side idempotency for effects outside the
database, with a reservation lease and a window, on both backends."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest

import sqlbroker
from helpers import table_counts


def test_the_effect_runs_once_per_key(clocked_broker: sqlbroker.Broker) -> None:
    runs: list[str] = []
    for key in ["order-1", "order-1", "order-2", "order-1"]:
        with clocked_broker.once("charge", key) as first:
            if first:
                runs.append(key)
    assert runs == ["order-1", "order-2"]


def test_scopes_are_independent(clocked_broker: sqlbroker.Broker) -> None:
    with clocked_broker.once("charge", "k") as first:
        assert first
    with clocked_broker.once("email", "k") as first:
        assert first


def test_a_failed_effect_releases_the_key_for_the_retry(clocked_broker: sqlbroker.Broker) -> None:
    def effect() -> None:
        with clocked_broker.once("charge", "k") as first:
            assert first
            raise RuntimeError("the payment API timed out")

    with pytest.raises(RuntimeError):
        effect()
    with clocked_broker.once("charge", "k") as first:
        assert first


def test_a_held_key_is_busy_until_its_holder_dies(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """A reservation whose lease runs is busy (a snooze for the runtime); once the lease
    ran out — the holder died — the next comer takes it, and the old holder's late
    confirmation is refused."""
    holder = clocked_broker.once("charge", "k", lease=10)
    assert holder.__enter__() is True
    with pytest.raises(sqlbroker.KeyInProgress) as caught, clocked_broker.once("charge", "k"):
        pass
    assert isinstance(caught.value, sqlbroker.Retry)
    assert 0 < caught.value.after <= 10
    clock.advance(11)
    with clocked_broker.once("charge", "k") as first:
        assert first
    with pytest.raises(sqlbroker.ReservationLost):
        holder.__exit__(None, None, None)
    with clocked_broker.once("charge", "k") as first:
        assert not first


def test_extend_keeps_a_long_effect_reserved(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    holder = clocked_broker.once("charge", "k", lease=10)
    with holder as first:
        assert first
        clock.advance(8)
        holder.extend()
        clock.advance(8)
        with pytest.raises(sqlbroker.KeyInProgress), clocked_broker.once("charge", "k"):
            pass
    with clocked_broker.once("charge", "k") as first:
        assert not first


def test_a_key_is_done_for_its_window_then_trimmed(
    make_broker: Any, clock: sqlbroker.ManualClock
) -> None:
    broker = make_broker(clock=clock, dedupe_window=3600)
    with broker.once("charge", "default") as first:
        assert first
    with broker.once("charge", "short", window=timedelta(minutes=1)) as first:
        assert first
    clock.advance(61)
    assert broker.reap()["processed_trimmed"] == 1
    with broker.once("charge", "short") as first:
        assert first
    with broker.once("charge", "default") as first:
        assert not first
    clock.advance(3600)
    with broker.once("charge", "default") as first:
        assert first


def test_forget_lets_the_effect_run_again(clocked_broker: sqlbroker.Broker) -> None:
    with clocked_broker.once("charge", "k"):
        pass
    assert clocked_broker.forget("charge", "k") is True
    assert clocked_broker.forget("charge", "k") is False
    with clocked_broker.once("charge", "k") as first:
        assert first


def test_an_integer_key_is_its_decimal_text(broker: sqlbroker.Broker) -> None:
    """The guides key ``once`` by ``msg.payload["order"]``, an int in their payloads."""
    broker.send_many("payments", [{"order": 42}, {"order": 42}, {"order": 7}])
    charged: list[int] = []

    @broker.subscriber(queue="payments", concurrency=1)
    def record(msg: sqlbroker.Message) -> None:
        with broker.once("charge", msg.payload["order"]) as first:
            if first:
                charged.append(msg.payload["order"])

    broker.run_until_idle(timeout=30)
    assert charged == [42, 7]
    assert broker.dead_letters.list() == []
    assert broker.pending("payments") == []
    with broker.once("charge", "42") as first:
        assert not first
    with broker.once("charge", -3) as first:
        assert first
    with pytest.raises(sqlbroker.InvalidName, match=r"^key: is an integer longer than 255"):
        broker.once("charge", -(10**5000))
    assert broker.forget("charge", 42)
    with broker.once("charge", "42") as first:
        assert first


def test_racing_consumers_run_the_effect_once(broker: sqlbroker.Broker) -> None:
    runs: list[int] = []
    busy: list[int] = []
    barrier = threading.Barrier(8)

    def consumer(index: int) -> None:
        barrier.wait()
        try:
            with broker.once("charge", "race", lease=30) as first:
                if first:
                    runs.append(index)
        except sqlbroker.KeyInProgress:
            busy.append(index)

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(runs) == 1
    with broker.once("charge", "race") as first:
        assert not first


def test_async_once(broker: sqlbroker.Broker, backend_url: str) -> None:
    async def scenario() -> list[bool]:
        seen = []
        async with sqlbroker.AsyncBroker(backend_url) as async_broker:
            for _ in range(2):
                async with async_broker.once("charge", "k") as first:
                    seen.append(first)
        return seen

    assert asyncio.run(scenario()) == [True, False]


@pytest.mark.parametrize(
    ("scope", "key", "options", "field"),
    [
        ("", "k", {}, "scope"),
        ("bad scope", "k", {}, "scope"),
        ("charge", "", {}, "key"),
        ("charge", None, {}, "key"),
        ("charge", True, {}, "key"),
        ("charge", 1.5, {}, "key"),
        ("charge", b"k", {}, "key"),
        ("charge", 10**300, {}, "key"),
        ("charge", "x" * 256, {}, "key"),
        ("charge", "k", {"lease": 0}, "lease"),
        ("charge", "k", {"lease": -1}, "lease"),
        ("charge", "k", {"window": 0}, "window"),
        ("charge", "k", {"window": "1h"}, "window"),
    ],
)
def test_bad_input_is_refused_before_sql(
    broker: sqlbroker.Broker, scope: Any, key: Any, options: dict[str, Any], field: str
) -> None:
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.ValidationError) as caught:
        broker.once(scope, key, **options)
    assert caught.value.field == field
    assert table_counts(broker.backend) == before


def test_the_runtime_snoozes_a_message_whose_key_is_busy(
    clocked_broker: sqlbroker.Broker,
) -> None:
    """KeyInProgress is a Retry: the message comes back later without using an attempt."""
    broker = clocked_broker
    holder = broker.once("charge", "k", lease=60)
    holder.__enter__()
    broker.send("jobs", {"order": "k"})
    attempts: list[int] = []

    @broker.subscriber(queue="jobs")
    def handle(msg: sqlbroker.Message) -> None:
        attempts.append(msg.attempt)
        with broker.once("charge", msg.payload["order"]) as first:
            assert first

    broker.run_until_idle(timeout=2)
    (pending,) = broker.pending("jobs")
    assert attempts == [1]
    assert pending.attempts == 0
