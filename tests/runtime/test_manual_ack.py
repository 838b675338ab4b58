"""``ack="manual"``: the handler (or whatever it hands the message to) settles the message
with exactly one of ``ack``, ``nack`` or ``reject``; the dead-letter hook is told why."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import sqlbroker
from runtime.support import assert_all_completed_once, run_until_idle, wait_until
from sqlbroker.core.settlements import Settlement


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_ack_nack_and_reject(broker: sqlbroker.Broker, kind: str) -> None:
    calls: list[tuple[str, int, float]] = []
    hooked: list[tuple[sqlbroker.Message, str]] = []

    def settle(msg: sqlbroker.Message) -> None:
        action = msg.payload["do"]
        calls.append((action, msg.attempt, time.monotonic()))
        if action == "ack":
            msg.ack()
        elif action == "nack-once" and msg.attempt == 1:
            msg.nack(after=0.3, error=RuntimeError("not yet"))
        elif action == "nack-once":
            msg.ack()
        elif action == "reject":
            msg.reject("not for us", error="wrong tenant")

    async def on_dead_letter(msg: sqlbroker.Message, reason: str) -> None:
        hooked.append((msg, reason))

    options: dict[str, Any] = {"queue": "jobs", "ack": "manual", "on_dead_letter": on_dead_letter}
    if kind == "async":

        @broker.subscriber(**options)
        async def handle_async(msg: sqlbroker.Message) -> None:
            settle(msg)

    else:

        @broker.subscriber(**options)
        def handle_sync(msg: sqlbroker.Message) -> None:
            settle(msg)

    acked = broker.send("jobs", {"do": "ack"})
    nacked = broker.send("jobs", {"do": "nack-once"})
    rejected = broker.send("jobs", {"do": "reject"})
    run_until_idle(broker)

    archived = broker.archive("jobs")
    assert {row.message_id: row.attempts for row in archived} == {acked: 1, nacked: 2}
    assert all(row.outcome == sqlbroker.Outcome.COMPLETED for row in archived)
    nack_times = [at for action, _, at in calls if action == "nack-once"]
    assert len(nack_times) == 2
    assert nack_times[1] - nack_times[0] >= 0.25

    (dead,) = broker.dead_letters.list(subscription="jobs")
    assert dead.message_id == rejected
    assert dead.attempts == 1
    assert dead.reason == "not for us"
    assert dead.error_message == "wrong tenant"
    assert broker.pending("jobs") == []

    ((message, reason),) = hooked
    assert isinstance(message, sqlbroker.Message)
    assert message.id == rejected
    assert message.payload == {"do": "reject"}
    assert reason == "not for us"


def test_a_second_settle_raises_and_changes_nothing(broker: sqlbroker.Broker) -> None:
    errors: list[BaseException] = []

    @broker.subscriber(queue="jobs", ack="manual")
    async def handle(msg: sqlbroker.Message) -> None:
        msg.ack()
        for second in (msg.ack, lambda: msg.nack(after=0), lambda: msg.reject("late")):
            try:
                second()
            except sqlbroker.SqlbrokerError as error:
                errors.append(error)
        assert msg.settled

    message_id = broker.send("jobs", {"n": 1})
    run_until_idle(broker)

    assert len(errors) == 3
    assert all(type(error).__name__ == "AlreadySettled" for error in errors), errors
    (archived,) = assert_all_completed_once(broker, "jobs", [message_id]).values()
    assert archived.attempts == 1


def test_settling_an_auto_acked_message_by_hand_is_refused(broker: sqlbroker.Broker) -> None:
    errors: list[BaseException] = []

    @broker.subscriber(queue="jobs")
    def handle(msg: sqlbroker.Message) -> None:
        try:
            msg.ack()
        except sqlbroker.SqlbrokerError as error:
            errors.append(error)

    message_id = broker.send("jobs", {"n": 1})
    run_until_idle(broker)

    assert len(errors) == 1
    assert "manual" in str(errors[0])
    assert_all_completed_once(broker, "jobs", [message_id])


def test_a_handler_that_raises_after_settling_keeps_its_settlement(
    broker: sqlbroker.Broker,
) -> None:
    @broker.subscriber(queue="jobs", ack="manual")
    async def handle(msg: sqlbroker.Message) -> None:
        msg.ack()
        raise RuntimeError("after the ack")

    message_id = broker.send("jobs", {"n": 1})
    run_until_idle(broker)
    (archived,) = assert_all_completed_once(broker, "jobs", [message_id]).values()
    assert archived.attempts == 1


@pytest.mark.parametrize(
    ("kind", "where"), [("sync", "handler"), ("sync", "timer"), ("async", "timer")]
)
def test_settling_from_another_thread_is_thread_safe(
    broker: sqlbroker.Broker, kind: str, where: str
) -> None:
    """Plain-function handlers run in threads, and any handler may hand its message on to
    another thread that settles it later. Settling from there must go through the event
    loop: the worker runs here in asyncio's debug mode, which raises on a non-thread-safe
    call into the loop, and with a long poll interval, so a settle that does not wake the
    loop is not written for a long time."""
    timers: list[threading.Timer] = []
    settled_at: list[float] = []
    errors: list[BaseException] = []

    def settle(msg: sqlbroker.Message) -> None:
        try:
            if msg.payload["n"] % 2 == 0 and msg.attempt == 1:
                msg.nack(after=0.1)
            else:
                msg.ack()
        except BaseException as error:
            errors.append(error)
            return
        settled_at.append(time.monotonic())

    def hand_on(msg: sqlbroker.Message) -> None:
        if where == "handler":
            settle(msg)
            return
        timer = threading.Timer(0.5, settle, args=[msg])
        timers.append(timer)
        timer.start()

    if kind == "async":

        @broker.subscriber(queue="jobs", ack="manual")
        async def hand_on_async(msg: sqlbroker.Message) -> None:
            hand_on(msg)

    else:

        @broker.subscriber(queue="jobs", ack="manual")
        def hand_on_sync(msg: sqlbroker.Message) -> None:
            hand_on(msg)

    ids = broker.send_many("jobs", [{"n": n} for n in range(1, 6)])
    options = {"install_signal_handlers": False, "poll_interval": 30.0, "reap_interval": 30.0}
    worker = broker.worker(**options)
    runner = threading.Thread(
        target=lambda: asyncio.run(worker.run_async(), debug=True), daemon=True
    )
    runner.start()
    try:
        # Two settles are nacks: those messages come back (0.1 s later) and are acked then.
        wait_until(lambda: len(settled_at) >= 7 or errors, timeout=20, what="every settle")
        assert errors == []
        wait_until(
            lambda: len(broker.archive("jobs")) == len(ids),
            timeout=10,
            what="every ack to be written",
        )
        assert time.monotonic() - max(settled_at) < 3
    finally:
        worker.stop()
        runner.join(timeout=30)
        for timer in timers:
            timer.cancel()
    assert not runner.is_alive()
    assert_all_completed_once(broker, "jobs", ids)


def test_the_dead_letter_hook_is_called_for_policy_dead_letters_too(
    broker: sqlbroker.Broker,
) -> None:
    hooked: list[tuple[str, str, int]] = []
    done = threading.Event()

    def on_dead_letter(msg: sqlbroker.Message, reason: str) -> None:
        hooked.append((msg.id, reason, msg.attempt))
        done.set()

    @broker.subscriber(
        queue="jobs",
        retry=sqlbroker.RetryPolicy(max_attempts=2, base=0.01),
        on_dead_letter=on_dead_letter,
    )
    async def handle(msg: sqlbroker.Message) -> None:
        await asyncio.sleep(0)
        raise LookupError("gone")

    message_id = broker.send("jobs", {"n": 1})
    run_until_idle(broker)

    assert done.is_set()
    assert hooked == [(message_id, "max attempts exhausted (2 of 2): LookupError", 2)]


def test_a_nack_on_the_last_attempt_dead_letters_by_the_retry_policy(
    broker: sqlbroker.Broker,
) -> None:
    """The retry policy decides "attempts spent" for a manual nack too: a handler that
    nacks every time is dead-lettered after the policy's attempts (it came back forever
    before), and the dead-letter hook is told why."""
    attempts: list[int] = []
    hooked: list[tuple[str, int]] = []

    def on_dead_letter(msg: sqlbroker.Message, reason: str) -> None:
        hooked.append((reason, msg.attempt))

    @broker.subscriber(
        queue="jobs",
        ack="manual",
        retry=sqlbroker.RetryPolicy(max_attempts=3),
        on_dead_letter=on_dead_letter,
    )
    async def handle(msg: sqlbroker.Message) -> None:
        attempts.append(msg.attempt)
        msg.nack(error=RuntimeError("not now"))

    message_id = broker.send("jobs", {"n": 1})
    run_until_idle(broker)

    assert attempts == [1, 2, 3]
    (dead,) = broker.dead_letters.list(subscription="jobs")
    assert dead.message_id == message_id
    assert (dead.reason, dead.attempts, dead.error_type) == (
        "max attempts exhausted (3 of 3)",
        3,
        "RuntimeError",
    )
    assert hooked == [("max attempts exhausted (3 of 3)", 3)]
    assert broker.pending("jobs") == []


def test_broker_retry_asks_the_retry_policy_whether_attempts_are_spent(
    broker: sqlbroker.Broker,
) -> None:
    """``Broker.retry`` and a worker's failures follow one rule (``RetryPolicy.spent``):
    the limit a worker's policy stamped on the copy at its claim holds for a manual
    consumer's retry as well."""
    policy = sqlbroker.RetryPolicy(max_attempts=2)
    assert policy.spent(1, max_attempts=5) is None
    assert policy.spent(2, max_attempts=5) == "max attempts exhausted (2 of 2)"
    broker.send("jobs", {"n": 1}, max_attempts=2)
    (first,) = broker.claim("jobs")
    assert policy.decide_retry(first, after=3.0) == Settlement.retry(first, 3.0)
    broker.retry(first, error="once")
    (second,) = broker.claim("jobs")
    assert second.attempt == 2
    broker.retry(second, error="twice")
    assert broker.pending("jobs") == []
    (dead,) = broker.dead_letters.list(subscription="jobs")
    assert dead.reason == "max attempts exhausted (2 of 2)"
