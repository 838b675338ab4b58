"""How a handler's result settles its message: sync and async handlers, timeouts, snoozes,
rejections, retry backoff and non-retryable errors. The worker runs in-process with
``run_until_idle``; the database is real."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest

import sqlbroker
from runtime.support import assert_all_completed_once, run_until_idle
from sqlbroker.core.message import ErrorInfo
from sqlbroker.core.settlements import Settlement


def only_dead_letter(
    broker: sqlbroker.Broker, queue: str, *, alone: bool = True
) -> sqlbroker.DeadLetter:
    """The queue's one dead letter; with ``alone``, nothing else is left or archived."""
    dead = broker.dead_letters.list(subscription=queue)
    assert len(dead) == 1, dead
    assert broker.pending(queue) == []
    if alone:
        assert broker.archive(queue) == []
    return dead[0]


def test_sync_handlers_run_in_threads_and_async_ones_on_the_event_loop(
    broker: sqlbroker.Broker,
) -> None:
    seen: dict[str, list[tuple[threading.Thread, bool]]] = {"sync": [], "async": []}

    def has_running_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @broker.subscriber(queue="plain", concurrency=3)
    def plain(msg: sqlbroker.Message) -> None:
        time.sleep(0.05)
        seen["sync"].append((threading.current_thread(), has_running_loop()))

    @broker.subscriber(queue="coroutine", concurrency=3)
    async def coroutine(msg: sqlbroker.Message) -> None:
        await asyncio.sleep(0.05)
        seen["async"].append((threading.current_thread(), has_running_loop()))

    plain_ids = broker.send_many("plain", list(range(6)))
    coroutine_ids = broker.send_many("coroutine", list(range(6)))
    run_until_idle(broker)

    assert_all_completed_once(broker, "plain", plain_ids)
    assert_all_completed_once(broker, "coroutine", coroutine_ids)
    loop_threads = {thread for thread, _ in seen["async"]}
    assert loop_threads == {threading.main_thread()}, "run_until_idle runs its loop here"
    assert all(in_loop for _, in_loop in seen["async"])
    sync_threads = {thread for thread, _ in seen["sync"]}
    assert len(seen["sync"]) == 6
    assert not sync_threads & loop_threads, "a sync handler ran on the event loop's thread"
    assert not any(in_loop for _, in_loop in seen["sync"])


def test_sync_handlers_run_concurrently_up_to_the_concurrency(
    broker: sqlbroker.Broker,
) -> None:
    lock = threading.Lock()
    running, peak = 0, 0

    @broker.subscriber(queue="jobs", concurrency=4, prefetch=0)
    def handle(msg: sqlbroker.Message) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.2)
        with lock:
            running -= 1

    ids = broker.send_many("jobs", list(range(12)))
    run_until_idle(broker)
    assert_all_completed_once(broker, "jobs", ids)
    assert 2 <= peak <= 4


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_handler_exceeding_its_timeout_fails_and_is_dead_lettered_when_attempts_are_spent(
    broker: sqlbroker.Broker, kind: str
) -> None:
    attempts: list[int] = []
    policy = sqlbroker.RetryPolicy(max_attempts=2, base=0.01, jitter="none")
    options: dict[str, Any] = {"queue": "slow", "timeout": 0.2, "retry": policy}
    if kind == "async":

        @broker.subscriber(**options)
        async def slow_async(msg: sqlbroker.Message) -> None:
            attempts.append(msg.attempt)
            await asyncio.sleep(10)

    else:

        @broker.subscriber(**options)
        def slow_sync(msg: sqlbroker.Message) -> None:
            attempts.append(msg.attempt)
            time.sleep(1.0)

    message_id = broker.send("slow", {"n": 1})
    elapsed = run_until_idle(broker)

    dead = only_dead_letter(broker, "slow")
    assert dead.message_id == message_id
    assert dead.attempts == 2
    assert attempts == [1, 2]
    assert "HandlerTimeout" in (dead.error_type or "")
    assert "max attempts exhausted" in dead.reason
    if kind == "async":
        assert elapsed < 5, "the timed-out coroutine was not cancelled"


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_a_coroutine_handler_runs_as_awaited_with_or_without_a_timeout(
    broker: sqlbroker.Broker, timeout: float | None
) -> None:
    """A coroutine handler's first step runs outside the timeout's scope (the scope starts
    at its first wait): what it returns, waiting or not, is stored, and a ``TimeoutError``
    of its own is a failure like any other, not a ``HandlerTimeout``."""

    @broker.subscriber(queue="waits", timeout=timeout)
    async def waits(msg: sqlbroker.Message) -> Any:
        await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        return {"n": msg.payload}

    @broker.subscriber(queue="returns", timeout=timeout)
    async def returns(msg: sqlbroker.Message) -> Any:
        return [msg.payload]

    @broker.subscriber(queue="own", timeout=timeout, retry=sqlbroker.RetryPolicy(max_attempts=1))
    async def own(msg: sqlbroker.Message) -> None:
        await asyncio.sleep(0)
        raise TimeoutError("the handler's own")

    first = broker.send("waits", 1)
    second = broker.send("returns", 2)
    broker.send("own", 3)
    run_until_idle(broker)

    for message_id, value in ((first, {"n": 1}), (second, [2])):
        stored = broker.result(message_id)
        assert stored is not None
        assert (stored.outcome, stored.value) == ("completed", value)
    dead = only_dead_letter(broker, "own")
    assert (dead.error_type or "").endswith("TimeoutError")
    assert "HandlerTimeout" not in (dead.error_type or "")
    assert "the handler's own" in (dead.error_message or "")


def test_a_coroutine_that_outlives_its_timeout_before_it_first_waits_times_out_there(
    broker: sqlbroker.Broker,
) -> None:
    """The timeout counts from the handler's start, also for a coroutine that ran past it
    without waiting: its first wait (even ``sleep(0)``) ends it, as the timer armed at the
    first wait (not at the start) must not push the deadline back."""
    went_on: list[int] = []

    @broker.subscriber(queue="busy", timeout=0.1, retry=sqlbroker.RetryPolicy(max_attempts=1))
    async def busy(msg: sqlbroker.Message) -> None:
        time.sleep(0.3)  # blocks the loop past the timeout, no wait
        await asyncio.sleep(0)
        went_on.append(msg.attempt)

    broker.send("busy", 1)
    run_until_idle(broker)

    dead = only_dead_letter(broker, "busy")
    assert "HandlerTimeout" in (dead.error_type or "")
    assert went_on == []


def test_a_sync_handler_stuck_past_its_timeout_does_not_hold_up_the_next_message(
    broker: sqlbroker.Broker,
) -> None:
    """The stuck thread cannot be stopped, but it must not take the next delivery's slot:
    a handler that never started must not be counted as a timed-out attempt."""
    started: dict[Any, float] = {}
    release = threading.Event()

    @broker.subscriber(
        queue="jobs",
        concurrency=1,
        prefetch=0,
        timeout=0.3,
        retry=sqlbroker.RetryPolicy(max_attempts=1),
    )
    def handle(msg: sqlbroker.Message) -> None:
        started[msg.payload] = time.monotonic()
        if msg.payload == "stuck":
            release.wait(10)

    broker.send("jobs", "stuck")
    quick = broker.send("jobs", "quick")
    try:
        run_until_idle(broker)
    finally:
        release.set()

    dead = only_dead_letter(broker, "jobs", alone=False)
    assert dead.payload == "stuck"
    assert "HandlerTimeout" in (dead.error_type or "")
    (archived,) = broker.archive("jobs")
    assert archived.message_id == quick
    assert archived.outcome == sqlbroker.Outcome.COMPLETED
    assert archived.attempts == 1
    assert started["quick"] - started["stuck"] < 5


def test_retry_after_snoozes_without_using_up_an_attempt(broker: sqlbroker.Broker) -> None:
    calls: list[tuple[int, float]] = []

    @broker.subscriber(queue="jobs", retry=sqlbroker.RetryPolicy(max_attempts=2))
    async def handle(msg: sqlbroker.Message) -> None:
        calls.append((msg.attempt, time.monotonic()))
        if len(calls) <= 3:
            raise sqlbroker.Retry(after=0.3)

    message_id = broker.send("jobs", {"n": 1})
    run_until_idle(broker)

    # Three snoozes with max_attempts=2 and the message still completes on attempt 1.
    assert [attempt for attempt, _ in calls] == [1, 1, 1, 1]
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(calls)]
    assert all(gap >= 0.25 for gap in gaps), gaps
    (archived,) = assert_all_completed_once(broker, "jobs", [message_id]).values()
    assert archived.attempts == 1


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_reject_dead_letters_at_once(broker: sqlbroker.Broker, kind: str) -> None:
    hooked: list[tuple[str, str]] = []

    def on_dead_letter(msg: sqlbroker.Message, reason: str) -> None:
        hooked.append((msg.id, reason))

    options: dict[str, Any] = {"queue": "jobs", "on_dead_letter": on_dead_letter}
    if kind == "async":

        @broker.subscriber(**options)
        async def reject_async(msg: sqlbroker.Message) -> None:
            raise sqlbroker.Reject("malformed order")

    else:

        @broker.subscriber(**options)
        def reject_sync(msg: sqlbroker.Message) -> None:
            raise sqlbroker.Reject("malformed order")

    message_id = broker.send("jobs", {"n": 1}, max_attempts=5)
    run_until_idle(broker)

    dead = only_dead_letter(broker, "jobs")
    assert dead.message_id == message_id
    assert dead.attempts == 1
    assert dead.reason == "malformed order"
    assert (dead.error_type or "").endswith("Reject")
    assert hooked == [(message_id, "malformed order")]


def test_retry_backoff_delays_are_respected(broker: sqlbroker.Broker) -> None:
    starts: list[float] = []
    policy = sqlbroker.RetryPolicy(max_attempts=3, base=0.4, jitter="none")

    @broker.subscriber(queue="jobs", retry=policy)
    async def handle(msg: sqlbroker.Message) -> None:
        starts.append(time.monotonic())
        if msg.attempt < 3:
            raise ConnectionError(f"attempt {msg.attempt} fails")

    message_id = broker.send("jobs", {"n": 1})
    run_until_idle(broker)

    (archived,) = assert_all_completed_once(broker, "jobs", [message_id]).values()
    assert archived.attempts == 3
    assert len(starts) == 3
    # Never before its backoff (0.4 s, then 0.8 s); no upper bound on a shared machine.
    assert starts[1] - starts[0] >= 0.4 * 0.9
    assert starts[2] - starts[1] >= 0.8 * 0.9


def test_the_last_error_of_a_retried_message_is_kept(broker: sqlbroker.Broker) -> None:
    policy = sqlbroker.RetryPolicy(max_attempts=3, base=0.01)

    @broker.subscriber(queue="jobs", retry=policy)
    def handle(msg: sqlbroker.Message) -> None:
        raise ValueError(f"bad value on attempt {msg.attempt}")

    broker.send("jobs", {"n": 1})
    run_until_idle(broker)

    dead = only_dead_letter(broker, "jobs")
    assert dead.attempts == 3
    assert dead.error_type == "ValueError"
    assert dead.error_message == "bad value on attempt 3"
    assert "ValueError" in (dead.traceback or "")
    assert dead.reason.startswith("max attempts exhausted (3 of 3)")


@pytest.mark.parametrize(
    ("policy", "error", "reason"),
    [
        (
            sqlbroker.RetryPolicy(dead_on=(KeyError,)),
            KeyError("missing"),
            "non-retryable error: KeyError",
        ),
        (
            sqlbroker.RetryPolicy(retry_on=(ConnectionError,)),
            ValueError("bad"),
            "error not in retry_on: ValueError",
        ),
    ],
    ids=["dead_on", "not_in_retry_on"],
)
def test_non_retryable_errors_dead_letter_at_once(
    broker: sqlbroker.Broker, policy: sqlbroker.RetryPolicy, error: Exception, reason: str
) -> None:
    @broker.subscriber(queue="jobs", retry=policy)
    def handle(msg: sqlbroker.Message) -> None:
        raise error

    broker.send("jobs", {"n": 1}, max_attempts=10)
    run_until_idle(broker)

    dead = only_dead_letter(broker, "jobs")
    assert dead.attempts == 1
    assert dead.reason == reason
    assert dead.error_type == type(error).__name__


class _Quota(Exception):
    """An error a custom policy treats as its own."""


class _CustomPolicy(sqlbroker.RetryPolicy):
    """What a user's subclass overrides: the backoff, and the decision itself (returning
    the delivery's settlement, or leaving it to the base class)."""

    def backoff(self, attempt: int) -> float:
        return 0.01

    def decide(self, delivery: sqlbroker.Delivery, error: BaseException) -> Settlement:
        if isinstance(error, _Quota) and delivery.attempt >= 2:
            return Settlement.dead(delivery, "over quota twice", ErrorInfo.from_exception(error))
        return super().decide(delivery, error)


def test_a_retry_policy_subclass_decides_the_settlement(broker: sqlbroker.Broker) -> None:
    """A subclass of ``RetryPolicy`` steers a worker's failures through ``backoff`` and
    ``decide``, which returns the delivery's ``Settlement``, as the base class does."""
    attempts: list[tuple[str, int]] = []

    @broker.subscriber(queue="jobs", retry=_CustomPolicy(max_attempts=3))
    def handle(msg: sqlbroker.Message) -> None:
        attempts.append((msg.payload, msg.attempt))
        raise _Quota() if msg.payload == "quota" else ValueError("bad")

    broker.send_many("jobs", ["quota", "value"])
    run_until_idle(broker)

    dead = {d.payload: d for d in broker.dead_letters.list(subscription="jobs")}
    assert (dead["quota"].reason, dead["quota"].attempts) == ("over quota twice", 2)
    assert (dead["value"].reason, dead["value"].attempts) == (
        "max attempts exhausted (3 of 3): ValueError",
        3,
    )
    assert sorted(attempts) == [
        ("quota", 1),
        ("quota", 2),
        ("value", 1),
        ("value", 2),
        ("value", 3),
    ]
