"""The worker as a whole, in-process: claim order, running until idle, the poll that
guarantees progress without hints, and a side task that dies."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from tests.seam.support import lock_waits

import sqlbroker
from helpers import loop_resources
from runtime.support import assert_all_completed_once, run_until_idle, wait_until


def test_priorities_are_respected_under_load(broker: sqlbroker.Broker) -> None:
    rng = random.Random(20240611)
    order: list[tuple[int, int]] = []

    @broker.subscriber(name="load", topics=["load.*"], concurrency=1, prefetch=0)
    async def handle(msg: sqlbroker.Message) -> None:
        order.append((msg.priority, msg.payload))

    broker.subscribe("load", ["load.*"])
    published = [(rng.randrange(10), index) for index in range(200)]
    for start in range(0, len(published), 50):
        broker.publish_many(
            {"topic": "load.item", "payload": index, "priority": priority}
            for priority, index in published[start : start + 50]
        )
    # A few more one at a time, so that ties span transactions as well as batches.
    for index in range(200, 220):
        published.append((index % 3, index))
        broker.publish("load.item", index, priority=index % 3)
    run_until_idle(broker)

    assert len(order) == len(published)
    assert order == sorted(published), "not in priority order, FIFO among equals"


def test_one_ordering_key_is_handled_one_at_a_time_in_publish_order(
    broker: sqlbroker.Broker,
) -> None:
    """Per-key order under a concurrent worker, with a failing head holding its key back
    until its retry succeeds."""
    handled: list[tuple[str, int]] = []
    in_flight: collections.Counter[str] = collections.Counter()
    overlaps: list[str] = []
    policy = sqlbroker.RetryPolicy(base=0.3, jitter="none")

    @broker.subscriber(queue="jobs", concurrency=4, retry=policy)
    async def handle(msg: sqlbroker.Message) -> None:
        assert msg.key is not None
        in_flight[msg.key] += 1
        if in_flight[msg.key] > 1:
            overlaps.append(msg.key)
        try:
            await asyncio.sleep(0.01)
            if msg.payload == 0 and msg.attempt == 1:
                raise ConnectionError("the head of k0 fails once")
            handled.append((msg.key, msg.payload))
        finally:
            in_flight[msg.key] -= 1

    ids = [broker.send("jobs", index, key=f"k{index % 3}") for index in range(30)]
    run_until_idle(broker)

    assert_all_completed_once(broker, "jobs", ids)
    assert overlaps == []
    for key in ("k0", "k1", "k2"):
        payloads = [payload for handled_key, payload in handled if handled_key == key]
        assert payloads == sorted(payloads)
        assert len(payloads) == 10


def test_run_until_idle_waits_for_retries_and_delayed_messages(broker: sqlbroker.Broker) -> None:
    calls: list[tuple[Any, int]] = []
    policy = sqlbroker.RetryPolicy(max_attempts=3, base=1.0, jitter="none")

    @broker.subscriber(queue="jobs", retry=policy)
    def handle(msg: sqlbroker.Message) -> None:
        calls.append((msg.payload, msg.attempt))
        if msg.payload == "flaky" and msg.attempt == 1:
            raise ConnectionError("try again in a second")

    flaky = broker.send("jobs", "flaky")
    later = broker.send("jobs", "later", delay=1.5)
    elapsed = run_until_idle(broker)

    assert elapsed >= 0.9
    archived = assert_all_completed_once(broker, "jobs", [flaky, later])
    assert archived[flaky].attempts == 2
    assert archived[later].attempts == 1
    assert sorted(calls) == [("flaky", 1), ("flaky", 2), ("later", 1)]


def test_run_until_idle_returns_at_once_when_there_is_nothing_to_do(
    broker: sqlbroker.Broker,
) -> None:
    @broker.subscriber(queue="jobs")
    async def handle(msg: sqlbroker.Message) -> None:
        raise AssertionError("nothing was sent")

    assert run_until_idle(broker) < 5
    assert broker.archive("jobs") == []


def test_messages_are_handled_within_the_poll_interval_when_hints_are_lost(
    broker: sqlbroker.Broker,
    make_broker: Callable[..., sqlbroker.Broker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Notifications are only hints: with none at all, the bounded poll still finds every
    message within the poll interval (plus a generous margin for a busy machine). The
    messages come from another broker, as from another process: a publish through the
    worker's own broker would wake it directly."""

    async def no_hints(
        *,
        on_hint: Callable[[str | None], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        await asyncio.get_running_loop().create_future()  # until cancelled

    monkeypatch.setattr(broker.backend, "listen_async", no_hints)
    poll_interval = 1.0
    handled: dict[int, float] = {}

    @broker.subscriber(queue="jobs")
    async def handle(msg: sqlbroker.Message) -> None:
        handled[msg.payload] = time.monotonic()

    runner = threading.Thread(
        target=broker.run,
        kwargs={"install_signal_handlers": False, "poll_interval": poll_interval},
        daemon=True,
    )
    publisher = make_broker()
    runner.start()
    try:
        latencies = []
        for index in range(3):
            # Let the worker go idle and back off to its longest poll first.
            time.sleep(2.5 * poll_interval if index == 0 else 1.3 * poll_interval)
            sent = time.monotonic()
            publisher.send("jobs", index)
            wait_until(lambda i=index: i in handled, timeout=20, what=f"message {index}")
            latencies.append(handled[index] - sent)
    finally:
        broker.stop()
        runner.join(timeout=30)
    assert not runner.is_alive()
    assert max(latencies) <= poll_interval + 1.0, latencies
    # Found by the poll, not by a hint: the poll's phase is random, so some message waited.
    assert max(latencies) > 0.05, latencies


CRASHING = {
    "message_extend_leases": "leases jobs",
    "lease_release_expired": "reaper",
    "message_settle_many": "write-back",
}


@pytest.mark.parametrize("method", list(CRASHING))
@pytest.mark.parametrize("runner", ["run_until_idle", "run"])
def test_a_side_task_that_dies_stops_the_worker_and_run_raises_worker_crashed(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch, method: str, runner: str
) -> None:
    starts: list[int] = []
    finishes: list[int] = []
    ops = broker.backend.async_ops  # the worker's side tasks run on its loop
    real = getattr(ops, method)
    calls = 0

    async def broken(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        # The reaper's first pass at start-up succeeds, so that a handler gets to start.
        if method == "lease_release_expired" and calls == 1:
            return await real(**kwargs)
        raise RuntimeError(f"{method} is broken")

    monkeypatch.setattr(ops, method, broken)

    @broker.subscriber(queue="jobs", concurrency=1, prefetch=2, lease=0.9)
    async def handle(msg: sqlbroker.Message) -> None:
        starts.append(msg.payload)
        await asyncio.sleep(0.5)
        finishes.append(msg.payload)

    ids = broker.send_many("jobs", list(range(5)))
    options: dict[str, Any] = {"install_signal_handlers": False, "reap_interval": 0.3}
    run = broker.run if runner == "run" else broker.run_until_idle
    with pytest.raises(sqlbroker.WorkerCrashed) as raised:
        run(timeout=30, **options)

    assert f"the worker's {CRASHING[method]} task died" in str(raised.value)
    assert f"{method} is broken" in str(raised.value)
    assert isinstance(raised.value.__cause__, RuntimeError)
    # It drained: every handler that started finished, unstarted claims were given back.
    assert starts
    assert starts == finishes
    monkeypatch.undo()
    pending = {p.message_id: p for p in broker.pending("jobs")}
    archived = {row.message_id: row for row in broker.archive("jobs")}
    started = {ids[payload] for payload in starts}
    unstarted = set(ids) - started
    assert all(pending[m].state == sqlbroker.State.AVAILABLE for m in unstarted), pending
    assert all(pending[m].attempts == 0 for m in unstarted), pending
    if method != "message_settle_many":
        assert set(archived) == started
        assert all(row.outcome == sqlbroker.Outcome.COMPLETED for row in archived.values())
        return
    # The finished handlers' outcomes could not be written: those messages stay leased
    # until the lease runs out, then they are delivered again. Nothing is lost.
    assert archived == {}
    assert {m for m, p in pending.items() if p.state == sqlbroker.State.RUNNING} == started
    time.sleep(1.0)
    assert broker.reap()["released"] == len(started)
    assert {p.message_id for p in broker.pending("jobs")} == set(ids)


def test_the_worker_can_run_again_after_it_stopped(broker: sqlbroker.Broker) -> None:
    @broker.subscriber(queue="jobs")
    async def handle(msg: sqlbroker.Message) -> None:
        pass

    first = broker.send("jobs", 1)
    run_until_idle(broker)
    second = broker.send("jobs", 2)
    run_until_idle(broker)
    assert_all_completed_once(broker, "jobs", [first, second])


def test_the_workers_schema_check_leaves_its_loop_running(pg_url: str, pg_server: Any) -> None:
    """An async application starts a worker on its own loop (``worker.run_async()``, with
    no operation of the broker's before it): the worker's schema check (a read of the
    versions table) must not stall that loop. Here another session holds
    the versions table, and a ticker task of the loop keeps ticking while the check waits;
    it used to be a blocking read on the loop, which then stood still until the lock went.
    """
    ticks = [0]
    seen_while_waiting: list[int] = []
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])

    with psycopg.connect(admin_url) as holder:
        holder.execute("LOCK TABLE sqlbroker_schema_version IN ACCESS EXCLUSIVE MODE")

        def let_go_once_it_waited() -> None:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                while lock_waits(admin) == 0:  # the check waits for the lock now
                    time.sleep(0.01)
            before = ticks[0]
            give_up = time.monotonic() + 10  # a stalled loop never ticks: do not wait for ever
            while ticks[0] - before < 5 and time.monotonic() < give_up:
                time.sleep(0.01)
            seen_while_waiting.append(ticks[0] - before)
            holder.commit()

        async def scenario() -> None:
            async def tick() -> None:
                while True:
                    ticks[0] += 1
                    await asyncio.sleep(0.01)

            async with sqlbroker.AsyncBroker(pg_url, lock_timeout=60) as broker:

                @broker.subscriber(queue="jobs")
                async def handle(msg: sqlbroker.Message) -> None:
                    pass

                worker = broker.worker(install_signal_handlers=False)
                ticker = asyncio.ensure_future(tick())
                try:
                    await worker.run_async(until_idle=True, timeout=60)
                finally:
                    ticker.cancel()

        letting_go = threading.Thread(target=let_go_once_it_waited)
        letting_go.start()
        try:
            asyncio.run(scenario())
        finally:
            letting_go.join()
    assert seen_while_waiting[0] >= 5, "the loop stood still while the check waited"


@dataclasses.dataclass
class Unmigrated:
    """A database nobody migrated, the broker options that name its sessions, and a count
    of what brokers hold for their loops (:func:`helpers.loop_resources`)."""

    url: str
    options: dict[str, Any]
    held: Callable[[], int]

    def let_go(self, before: int) -> None:
        wait_until(
            lambda: self.held() <= before, timeout=10, what="the worker's loop resources let go"
        )


@pytest.fixture
def unmigrated(backend_url: str, tmp_path: Any) -> Unmigrated:
    application = "sqlbroker_leak_check"
    held = loop_resources(backend_url, application)
    if backend_url.startswith("sqlite"):
        return Unmigrated(f"sqlite:///{tmp_path}/empty.db", {}, held)
    options = {"schema": "sqlbroker_never_made", "application_name": application}
    return Unmigrated(backend_url, options, held)


@pytest.mark.parametrize("runner", ["run", "run_async"])
def test_a_worker_whose_schema_check_fails_lets_go_of_its_connections(
    unmigrated: Unmigrated, runner: str
) -> None:
    """The worker's readiness check fails (here on a database nobody migrated, with
    ``migrate=False``) after it opened its loop's resources — PostgreSQL's connections,
    SQLite's threads: ``run`` and ``run_async`` raise the check's error and let them go, as
    a stopping worker does, not when the broker is closed."""
    url, options = unmigrated.url, unmigrated.options

    def handle(msg: sqlbroker.Message) -> None:
        pass

    before = unmigrated.held()  # SQLite: threads of other brokers not let go yet
    refused = pytest.raises(sqlbroker.SchemaError, match="at version 0")
    if runner == "run":
        with sqlbroker.Broker(url, migrate=False, **options) as broker:
            broker.subscriber(queue="jobs")(handle)
            with refused:
                broker.worker(install_signal_handlers=False).run(until_idle=True, timeout=30)
            unmigrated.let_go(before)
        return

    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(url, migrate=False, **options) as broker:
            broker.subscriber(queue="jobs")(handle)
            with refused:
                await broker.worker(install_signal_handlers=False).run_async(timeout=30)
            unmigrated.let_go(before)

    asyncio.run(scenario())


SAGA = sqlbroker.Saga("order", [sqlbroker.Step("reserve"), sqlbroker.Step("ship")])


@pytest.mark.parametrize("method", ["run", "run_until_idle"])
@pytest.mark.parametrize("face", ["Broker", "AsyncBroker"])
def test_a_broker_run_whose_schema_check_fails_lets_go_of_its_connections(
    unmigrated: Unmigrated, face: str, method: str
) -> None:
    """``broker.run()`` and ``run_until_idle()`` (either face, with a saga's handlers,
    whose check once ran before the worker's) fail their schema check as the worker's
    own run does: the check's error, and nothing of the broker's left open for it."""
    url, options = unmigrated.url, unmigrated.options
    refused = pytest.raises(sqlbroker.SchemaError, match="at version 0")
    before = unmigrated.held()
    if face == "Broker":
        with sqlbroker.Broker(url, migrate=False, **options) as broker:
            broker.saga_step(SAGA, "reserve")(lambda ctx: None)
            with refused:
                getattr(broker, method)(install_signal_handlers=False, timeout=30)
            unmigrated.let_go(before)
        return

    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(url, migrate=False, **options) as broker:
            broker.saga_step(SAGA, "reserve")(lambda ctx: None)
            with refused:
                await getattr(broker, method)(install_signal_handlers=False, timeout=30)
            unmigrated.let_go(before)

    asyncio.run(scenario())
