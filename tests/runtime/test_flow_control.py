"""Pause and cancel with a real worker (docs/flow-control.md): a paused subscription claims
nothing while another one drains, a handler running at the pause finishes, and a cancel
reaches a running handler — a coroutine is cancelled mid-sleep, a plain function sees
``msg.cancelled`` — and the copy ends ``cancelled`` also when the handler finishes anyway."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import sqlbroker
from runtime.support import wait_until

LIMIT = 30.0


def _start(broker: sqlbroker.Broker) -> threading.Thread:
    runner = threading.Thread(
        target=broker.run,
        kwargs={"install_signal_handlers": False, "timeout": LIMIT},
        daemon=True,
    )
    runner.start()
    return runner


def _stop(broker: sqlbroker.Broker, runner: threading.Thread) -> None:
    broker.stop()
    runner.join(LIMIT)
    assert not runner.is_alive()


def _outcomes(broker: sqlbroker.Broker, queue: str) -> dict[str, str]:
    return {row.message_id: row.outcome.value for row in broker.archive(queue)}


def test_an_async_handler_is_cancelled_mid_sleep(broker: sqlbroker.Broker) -> None:
    started: list[str] = []
    finished: list[str] = []

    @broker.subscriber(queue="jobs", concurrency=1)
    async def handle(msg: sqlbroker.Message) -> None:
        started.append(msg.id)
        await asyncio.sleep(3600)
        finished.append(msg.id)

    ids = [broker.send("jobs", {"n": n}) for n in range(2)]
    runner = _start(broker)
    try:
        for count in (1, 2):
            # The worker goes on after a cancel: the next message starts in the same slot.
            wait_until(lambda n=count: len(started) == n, timeout=LIMIT, what="a handler to start")
            running = started[-1]
            assert broker.cancel(running) == 1
            wait_until(
                lambda m=running: _outcomes(broker, "jobs").get(m) == "cancelled",
                timeout=LIMIT,
                what="the running copy to be archived as cancelled",
            )
    finally:
        _stop(broker, runner)
    assert finished == []
    assert sorted(started) == sorted(ids)
    rows = broker.archive("jobs")
    assert sorted((r.message_id, r.outcome, r.attempts) for r in rows) == sorted(
        (m, sqlbroker.Outcome.CANCELLED, 1) for m in ids
    )


def test_a_claimed_copy_cancelled_before_it_starts_never_runs(broker: sqlbroker.Broker) -> None:
    started: list[str] = []
    release = threading.Event()

    @broker.subscriber(queue="jobs", concurrency=1, prefetch=1)
    def handle(msg: sqlbroker.Message) -> None:
        started.append(msg.id)
        release.wait(LIMIT)

    first, second = broker.send("jobs", 1), broker.send("jobs", 2)
    runner = _start(broker)
    try:
        wait_until(lambda: started, timeout=LIMIT, what="the first handler to start")
        wait_until(
            lambda: [p.state.value for p in broker.pending("jobs")] == ["running", "running"],
            timeout=LIMIT,
            what="the second copy to be claimed into the buffer",
        )
        assert broker.cancel(second) == 1
        wait_until(lambda: second in _outcomes(broker, "jobs"), timeout=LIMIT, what="the cancel")
        release.set()
        wait_until(lambda: first in _outcomes(broker, "jobs"), timeout=LIMIT, what="the first")
    finally:
        release.set()
        _stop(broker, runner)
    assert started == [first]
    assert _outcomes(broker, "jobs") == {first: "completed", second: "cancelled"}


def test_a_plain_function_sees_msg_cancelled_and_is_recorded_cancelled(
    broker: sqlbroker.Broker,
) -> None:
    started = threading.Event()
    seen: list[tuple[bool, bool]] = []

    @broker.subscriber(queue="jobs")
    def handle(msg: sqlbroker.Message) -> str:
        started.set()
        assert not msg.cancelled
        while not msg.cancelled:
            time.sleep(0.01)
        seen.append((msg.cancelled, msg.cancel_event.is_set()))
        return "finished anyway"  # ignores the cancel: still recorded as cancelled

    message_id = broker.send("jobs", {"n": 1})
    runner = _start(broker)
    try:
        wait_until(started.is_set, timeout=LIMIT, what="the handler to start")
        assert broker.cancel(message_id) == 1
        wait_until(
            lambda: _outcomes(broker, "jobs").get(message_id),
            timeout=LIMIT,
            what="the copy to be archived",
        )
    finally:
        _stop(broker, runner)
    assert seen == [(True, True)]
    assert _outcomes(broker, "jobs") == {message_id: "cancelled"}
    assert broker.result(message_id) is None or broker.result(message_id).value is None


def test_an_async_handler_that_swallows_the_cancel_is_recorded_cancelled(
    broker: sqlbroker.Broker,
) -> None:
    started = threading.Event()
    swallowed: list[str] = []

    @broker.subscriber(queue="jobs", ack="manual")
    async def handle(msg: sqlbroker.Message) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.append(msg.id)
        msg.ack()

    message_id = broker.send("jobs", {"n": 1})
    runner = _start(broker)
    try:
        wait_until(started.is_set, timeout=LIMIT, what="the handler to start")
        assert broker.cancel(message_id) == 1
        wait_until(
            lambda: _outcomes(broker, "jobs").get(message_id),
            timeout=LIMIT,
            what="the copy to be archived",
        )
    finally:
        _stop(broker, runner)
    assert swallowed == [message_id]
    assert _outcomes(broker, "jobs") == {message_id: "cancelled"}


def test_a_paused_subscription_claims_nothing_and_its_running_handler_finishes(
    broker: sqlbroker.Broker,
) -> None:
    started = threading.Event()
    release = threading.Event()
    done: list[Any] = []

    @broker.subscriber(queue="paused")
    def slow(msg: sqlbroker.Message) -> None:
        started.set()
        release.wait(LIMIT)
        done.append(msg.payload)

    @broker.subscriber(queue="other")
    def fast(msg: sqlbroker.Message) -> None:
        done.append(msg.payload)

    first = broker.send("paused", "first")
    runner = _start(broker)
    try:
        wait_until(started.is_set, timeout=LIMIT, what="the first handler to start")
        broker.pause("paused", note="deploy")
        held = [broker.send("paused", f"held {n}") for n in range(3)]
        others = [broker.send("other", n) for n in range(20)]
        release.set()
        # The other subscription drains meanwhile: the worker kept claiming all along.
        wait_until(
            lambda: set(others) <= set(_outcomes(broker, "other")),
            timeout=LIMIT,
            what="the other subscription to drain",
        )
        wait_until(lambda: first in _outcomes(broker, "paused"), timeout=LIMIT, what="first")
        assert {p.message_id for p in broker.pending("paused")} == set(held)
        assert all(p.state.value == "available" for p in broker.pending("paused"))
        (stats,) = [s for s in broker.stats() if s.subscription == "paused"]
        assert (stats.paused, stats.ready, stats.running) == (True, 3, 0)
        broker.resume("paused")
        wait_until(
            lambda: set(held) <= set(_outcomes(broker, "paused")),
            timeout=LIMIT,
            what="the resumed subscription to drain",
        )
    finally:
        release.set()
        _stop(broker, runner)
    assert _outcomes(broker, "paused") == dict.fromkeys([first, *held], "completed")
    actions = [entry.action for entry in broker.audit(limit=5)]
    assert actions[:2] == ["subscription.resume", "subscription.pause"]
