"""The stop, however it comes, leaves nothing behind: every outcome is written (also one a
flush in flight failed to write, or a manual ack due within the grace period), every
dead-letter hook runs, unstarted claims go back uncounted — and what cannot be written any
more fails loudly instead of vanishing."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

import sqlbroker
from runtime.support import assert_all_completed_once, wait_until
from sqlbroker.runtime.writeback import WriteBack

LIMIT = 20.0
"""A bound against a hang, never a measure of speed."""


def _watch_final_beat(broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set by the worker's last heartbeat, which follows its final write-back."""
    final_beat = threading.Event()
    real = broker.backend.async_ops.worker_beat

    async def worker_beat(**kwargs: Any) -> Any:
        try:
            return await real(**kwargs)
        finally:
            if kwargs["beat"].stopping:
                final_beat.set()

    monkeypatch.setattr(broker.backend.async_ops, "worker_beat", worker_beat)
    return final_beat


def _run_in_thread(broker: sqlbroker.Broker, **options: Any) -> threading.Thread:
    runner = threading.Thread(
        target=broker.run,
        kwargs={"install_signal_handlers": False, "timeout": LIMIT, **options},
        daemon=True,
    )
    runner.start()
    return runner


@pytest.mark.parametrize("flush", ["fails", "succeeds"])
def test_the_final_write_back_waits_for_the_flush_in_flight(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch, flush: str
) -> None:
    """The stop comes while the write-back task's own flush is running. If that flush
    fails, its outcome must still be written by the final drain; if it succeeds, the
    dead-letter hook it starts must still run before the worker returns."""
    final_beat = _watch_final_beat(broker, monkeypatch)
    hooked: list[str] = []
    real_settle_many = broker.backend.async_ops.message_settle_many
    calls = 0
    in_flight = False
    drain_waits = threading.Event()
    real_flush = WriteBack.flush

    async def watched_flush(self: WriteBack) -> bool:
        if in_flight:  # the final drain asks for a flush while the first one runs
            drain_waits.set()
        return await real_flush(self)

    async def settle_many(**kwargs: Any) -> Any:
        nonlocal calls, in_flight
        calls += 1
        if calls == 1:
            in_flight = True
            broker.stop()
            # A fixed worker's final drain now waits for this flush; an unfixed one goes
            # on to its final heartbeat without it. (Waited for off the loop: the drain
            # and the heartbeat run on it.)
            await asyncio.to_thread(
                wait_until,
                lambda: drain_waits.is_set() or final_beat.is_set(),
                timeout=LIMIT,
                what="the final drain or the final heartbeat",
                interval=0.01,
            )
            if flush == "fails":
                raise sqlbroker.ConnectionLost("injected", ambiguous=False)
        return await real_settle_many(**kwargs)

    monkeypatch.setattr(broker.backend.async_ops, "message_settle_many", settle_many)
    monkeypatch.setattr(WriteBack, "flush", watched_flush)

    async def on_dead_letter(msg: sqlbroker.Message, reason: str) -> None:
        await asyncio.sleep(0.05)
        hooked.append(msg.id)

    @broker.subscriber(queue="jobs", on_dead_letter=on_dead_letter)
    async def handle(msg: sqlbroker.Message) -> None:
        raise sqlbroker.Reject("unwanted")

    message_id = broker.send("jobs", 1)
    broker.run(install_signal_handlers=False, timeout=LIMIT)

    assert calls >= 1 + (flush == "fails")
    assert [dead.message_id for dead in broker.dead_letters.list()] == [message_id]
    assert broker.pending("jobs") == []
    assert hooked == [message_id]


def test_cancelling_run_async_shuts_down_gracefully(broker: sqlbroker.Broker) -> None:
    """An application cancels the worker's task: the running handler still finishes and
    its outcome is written, the claimed-but-unstarted messages go back uncounted, and the
    cancellation is raised once that is done."""
    handled: list[int] = []
    started: asyncio.Event | None = None

    @broker.subscriber(queue="jobs", concurrency=1, prefetch=2)
    async def handle(msg: sqlbroker.Message) -> None:
        assert started is not None
        handled.append(msg.payload)
        started.set()
        await asyncio.sleep(0.2)

    ids = broker.send_many("jobs", [0, 1, 2])

    async def main() -> None:
        nonlocal started
        started = asyncio.Event()
        task = asyncio.create_task(broker.worker(install_signal_handlers=False).run_async())
        await asyncio.wait_for(started.wait(), LIMIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())

    assert handled == [0]
    assert [row.message_id for row in broker.archive("jobs")] == [ids[0]]
    pending = {p.message_id: p for p in broker.pending("jobs")}
    assert set(pending) == set(ids[1:])
    assert all(p.state == sqlbroker.State.AVAILABLE and p.attempts == 0 for p in pending.values())


def test_the_shutdown_waits_for_manual_acks_within_the_grace_period(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler hands its message on and returns; the ack comes from another thread
    after the stop. Within the grace period it must be written, not dropped."""
    final_beat = _watch_final_beat(broker, monkeypatch)
    held: list[sqlbroker.Message] = []
    got = threading.Event()

    @broker.subscriber(queue="jobs", ack="manual")
    async def handle(msg: sqlbroker.Message) -> None:
        held.append(msg)
        got.set()

    message_id = broker.send("jobs", 1)
    runner = _run_in_thread(broker)
    assert got.wait(LIMIT)
    caplog.set_level(logging.INFO, logger="sqlbroker.runtime")
    broker.stop()
    wait_until(
        lambda: "waiting for 1 message(s) still to be settled by hand" in caplog.text,
        timeout=LIMIT,
        what="the shutdown to wait for the manual ack",
    )
    assert not final_beat.is_set()
    held[0].ack()
    runner.join(LIMIT)
    assert not runner.is_alive()
    assert_all_completed_once(broker, "jobs", [message_id])


def test_an_ack_after_the_final_write_back_raises(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no grace left, an ack that comes after the final write-back cannot be written:
    it raises, and the message comes back when its lease expires."""
    held: list[sqlbroker.Message] = []
    got = threading.Event()
    late: list[BaseException | None] = []
    real = broker.backend.async_ops.worker_beat

    async def worker_beat(**kwargs: Any) -> Any:
        if kwargs["beat"].stopping and held:
            try:
                await asyncio.to_thread(held[0].ack)
            except sqlbroker.SqlbrokerError as error:
                late.append(error)
            else:
                late.append(None)
        return await real(**kwargs)

    monkeypatch.setattr(broker.backend.async_ops, "worker_beat", worker_beat)

    @broker.subscriber(queue="jobs", ack="manual")
    async def handle(msg: sqlbroker.Message) -> None:
        held.append(msg)
        got.set()

    message_id = broker.send("jobs", 1)
    runner = _run_in_thread(broker, grace=0)
    assert got.wait(LIMIT)
    broker.stop()
    runner.join(LIMIT)
    assert not runner.is_alive()

    (error,) = late
    assert error is not None, "the late ack returned as if it had been written"
    assert "stopped" in str(error)
    assert not held[0].settled
    (pending,) = broker.pending("jobs")
    assert pending.message_id == message_id
    assert pending.state == sqlbroker.State.RUNNING


def test_a_claim_that_wakes_an_idle_slot_just_before_the_stop_is_not_started(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop is requested while the claim returns: the claimed message wakes an idle
    handler slot, but the stop comes first; the handler must not start, and the message
    goes back uncounted."""
    handled: list[Any] = []
    real_claim = broker.backend.async_ops.message_claim_many

    async def claim(**kwargs: Any) -> Any:
        found = await real_claim(**kwargs)
        if found:
            broker.stop()
        return found

    monkeypatch.setattr(broker.backend.async_ops, "message_claim_many", claim)

    @broker.subscriber(queue="jobs", concurrency=1)
    async def handle(msg: sqlbroker.Message) -> None:
        handled.append(msg.payload)

    message_id = broker.send("jobs", 1)
    broker.run(install_signal_handlers=False, timeout=LIMIT)

    assert handled == []
    (pending,) = broker.pending("jobs")
    assert pending.message_id == message_id
    assert pending.state == sqlbroker.State.AVAILABLE
    assert pending.attempts == 0


def test_an_unstarted_delivery_whose_lease_was_lost_is_not_run(
    clocked_broker: sqlbroker.Broker,
    clock: sqlbroker.ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two messages are claimed, one runs and the other waits for the slot. Both leases
    run out and another consumer claims both. The lease keeper finds them lost: the one
    still waiting must not be started here as well."""
    broker = clocked_broker
    caplog.set_level(logging.WARNING, logger="sqlbroker.runtime")
    handled: list[str] = []
    started = threading.Event()
    go = threading.Event()
    extending = threading.Lock()
    real_extend = broker.backend.async_ops.message_extend_leases

    async def extend(**kwargs: Any) -> Any:
        await asyncio.to_thread(extending.acquire)  # never between the test's clock move
        try:  # and its claim
            return await real_extend(**kwargs)
        finally:
            extending.release()

    monkeypatch.setattr(broker.backend.async_ops, "message_extend_leases", extend)

    @broker.subscriber(queue="jobs", concurrency=1, prefetch=1, lease=3.0)
    def handle(msg: sqlbroker.Message) -> None:
        handled.append(msg.payload)
        if msg.payload == "first":
            started.set()
            go.wait(LIMIT)

    broker.send("jobs", "first")
    second = broker.send("jobs", "second")
    runner = _run_in_thread(broker)
    try:
        assert started.wait(LIMIT)
        wait_until(
            lambda: all(p.state == sqlbroker.State.RUNNING for p in broker.pending("jobs")),
            timeout=LIMIT,
            what="both messages to be claimed",
        )
        with extending:
            clock.advance(10)
            broker.reap()
            stolen = broker.claim("jobs", limit=2, lease=600)
        assert len(stolen) == 2

        def logged(text: str) -> bool:
            return any(second in r.getMessage() and text in r.getMessage() for r in caplog.records)

        wait_until(lambda: logged("lost the lease"), timeout=LIMIT, what="the lost lease")
        go.set()
        wait_until(
            lambda: any("was lost before its outcome" in r.getMessage() for r in caplog.records),
            timeout=LIMIT,
            what="the first message's outcome to be refused",
        )
    finally:
        go.set()
        broker.stop()
        runner.join(LIMIT)
    assert not runner.is_alive()
    assert handled == ["first"]
    broker.complete(stolen)
    assert len(broker.archive("jobs")) == 2


@pytest.mark.postgres
def test_a_cancelled_worker_does_not_block_the_loop_on_a_database_call_in_flight(
    pg_url: str,
) -> None:
    """The worker is cancelled while its first database call waits on a lock. Its clean-up
    waits for that call off the event loop: the application's other tasks run on."""
    import psycopg

    with (
        sqlbroker.Broker(pg_url) as broker,
        psycopg.connect(pg_url) as blocker,
        psycopg.connect(pg_url, autocommit=True) as watcher,
    ):

        @broker.subscriber(queue="jobs")
        async def handle(msg: sqlbroker.Message) -> None:
            pass

        unlock = threading.Lock()
        unlocked_by: list[str] = []

        def release(by: str) -> None:
            with unlock:
                if not unlocked_by:
                    unlocked_by.append(by)
                    blocker.commit()

        def waiting_on_lock() -> bool:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query ILIKE '%%sqlbroker_subscription%%'"
            ).fetchone()
            return row is not None and row[0] >= 1

        blocker.execute("LOCK TABLE sqlbroker_subscription IN ACCESS EXCLUSIVE MODE")
        fallback = threading.Timer(LIMIT / 2, release, args=["fallback"])
        fallback.start()

        async def main() -> None:
            task = asyncio.create_task(broker.worker(install_signal_handlers=False).run_async())
            await asyncio.to_thread(
                wait_until, waiting_on_lock, timeout=LIMIT, what="the lock wait"
            )
            task.cancel()
            await asyncio.sleep(0.1)  # runs only if the loop is not blocked
            release("the application")
            with pytest.raises(asyncio.CancelledError):
                await task

        try:
            asyncio.run(main())
        finally:
            fallback.cancel()
            release("the test")
        assert unlocked_by == ["the application"]


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_shutdowns_that_cancel_a_slow_handler_spend_no_attempt(
    broker: sqlbroker.Broker, kind: str
) -> None:
    """A deploy stops the worker while a slow handler runs and the grace period runs out:
    the handler is given up, which is not a failure. However many deploys, the message
    keeps its attempts and is never dead-lettered for it."""
    started = threading.Event()
    release = threading.Event()

    if kind == "async":

        @broker.subscriber(queue="slow", retry=sqlbroker.RetryPolicy(max_attempts=2))
        async def handle(msg: sqlbroker.Message) -> None:
            started.set()
            await asyncio.sleep(LIMIT * 10)

    else:

        @broker.subscriber(queue="slow", retry=sqlbroker.RetryPolicy(max_attempts=2))
        def handle_sync(msg: sqlbroker.Message) -> None:
            started.set()
            release.wait(LIMIT)

    message_id = broker.send("slow", 1, max_attempts=2)
    try:
        for _ in range(4):
            started.clear()
            runner = _run_in_thread(broker, grace=0)
            assert started.wait(LIMIT)
            broker.stop()
            runner.join(LIMIT)
            assert not runner.is_alive()
            assert broker.dead_letters.list() == []
            (pending,) = broker.pending("slow")
            assert pending.message_id == message_id
            assert pending.state == sqlbroker.State.AVAILABLE
            assert pending.attempts == 0
    finally:
        release.set()
