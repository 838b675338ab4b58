"""AsyncBroker as a face of its own: native on PostgreSQL (no thread per call), bounded
connections across event loops, subscribers and a worker on the caller's loop; and no
property of either face runs anything."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import sqlbroker
from helpers import loop_resources


class _CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor (what ``asyncio.to_thread`` uses), counting its jobs."""

    submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        type(self).submitted += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.postgres
def test_async_calls_on_postgresql_run_on_the_loop(pg_url: str) -> None:
    """After the first call (which reads the schema version once), publishes, claims and
    settlements hop to no thread: the publish listener, called right after the insert,
    runs on the loop's thread, and the loop's default executor gets no job."""
    listened: set[int] = set()

    async def scenario() -> int:
        asyncio.get_running_loop().set_default_executor(_CountingExecutor())
        async with sqlbroker.AsyncBroker(pg_url) as broker:
            broker.add_publish_listener(lambda _: listened.add(threading.get_ident()))
            await broker.send("warmup", 0)
            before = _CountingExecutor.submitted
            await broker.subscribe("sub", "orders.*")
            for n in range(10):
                await broker.publish("orders.created", n)
            await broker.send_many("q", [1, 2, 3])
            deliveries = await broker.claim("sub", limit=20)
            await broker.complete(deliveries[:5])
            await broker.retry(deliveries[5], after=60)
            await broker.extend(deliveries[6])
            await broker.release(deliveries[7:])
            assert await broker.pending("sub")
            assert await broker.dead_letters.list() == []
            async with broker.once("charge", 1) as first:
                assert first
            return _CountingExecutor.submitted - before

    assert asyncio.run(scenario()) == 0
    assert listened == {threading.get_ident()}


@pytest.mark.postgres
def test_async_administration_on_postgresql_runs_on_the_loop(pg_url: str) -> None:
    """Stats, workers, metrics, retention, flow limits and schedules read and change
    through the async pool too: the loop's default executor gets no job."""

    async def scenario() -> int:
        asyncio.get_running_loop().set_default_executor(_CountingExecutor())
        async with sqlbroker.AsyncBroker(pg_url) as broker:
            await broker.subscribe("admin", "admin.*")
            before = _CountingExecutor.submitted
            assert await broker.schema_version() > 0
            await broker.publish("admin.created", 1)
            assert [s.subscription for s in await broker.stats()] == ["admin"]
            assert await broker.workers() == []
            assert list(await broker.metrics_series(minutes=2)) == ["admin"]
            assert (await broker.unrouted()).total == 0
            assert (await broker.set_retention("admin", archive=3600)).archive == 3600
            assert [r.archive for r in await broker.retention("admin")] == [3600]
            assert (await broker.set_flow("admin", max_running=2)).limits.max_running == 2
            assert [f.limits.max_running for f in await broker.flow("admin")] == [2]
            with pytest.raises(sqlbroker.NotFound):
                await broker.set_flow("nobody", max_running=2)
            assert (await broker.schedule("tick", "admin.tick", 1, every=60)).name == "tick"
            assert await broker.pause_schedule("tick")
            assert await broker.resume_schedule("tick")
            assert [s.paused for s in await broker.schedules(["tick"])] == [False]
            assert await broker.unschedule("tick")
            return _CountingExecutor.submitted - before

    assert asyncio.run(scenario()) == 0


def _default_executor_jobs(
    url: str, body: Callable[[sqlbroker.AsyncBroker], Awaitable[None]], **options: Any
) -> int:
    """The jobs ``body`` put on the loop's default executor, after a first operation has
    checked the schema (see test_first_use_and_migrate_keep_off_the_default_executor)."""

    async def scenario() -> int:
        asyncio.get_running_loop().set_default_executor(_CountingExecutor())
        broker = sqlbroker.AsyncBroker(url, migrate=True, **options)
        try:
            await broker.pending()
            before = _CountingExecutor.submitted
            await body(broker)
            return _CountingExecutor.submitted - before
        finally:
            await broker.close()

    return asyncio.run(scenario())


def test_a_waiting_result_keeps_off_the_default_executor(backend_url: str) -> None:
    """``result(wait=…)`` looks on the backend's coroutine operations and sleeps on the
    loop, woken by the backend's one result source: no job for the loop's executor."""

    async def body(broker: sqlbroker.AsyncBroker) -> None:
        message_id = await broker.send("jobs", 21)
        assert await broker.result(message_id) is None
        assert await broker.result(message_id, wait=0.2) is None  # waits, then gives up
        (delivery,) = await broker.claim("jobs")
        waiting = asyncio.ensure_future(broker.result(message_id, wait=60))
        await broker.complete(delivery, result=42)
        found = await waiting
        assert found is not None
        assert found.value == 42

    assert _default_executor_jobs(backend_url, body) == 0


def test_run_due_schedules_keeps_off_the_default_executor(backend_url: str) -> None:
    """A scheduler pass is coroutines end to end: the due scan and the fire (advance,
    publish, point at the message) as one transaction of the backend's async operations."""
    clock = sqlbroker.ManualClock()

    async def body(broker: sqlbroker.AsyncBroker) -> None:
        await broker.subscribe("seen", "ticks.#")
        await broker.schedule("every-minute", "ticks.minute", {"n": 1}, every=60)
        assert (await broker.run_due_schedules()).published == {}
        clock.advance(60)
        run = await broker.run_due_schedules()
        assert [len(ids) for ids in run.published.values()] == [1]
        assert [m.message_id for m in await broker.pending("seen")] == run.published["every-minute"]

    assert _default_executor_jobs(backend_url, body, clock=clock) == 0


def test_reap_keeps_off_the_default_executor(backend_url: str) -> None:
    """The reaper's pass, its sagas' sweep (blocking by design) included, runs on the
    backend's coroutines and own threads."""

    async def body(broker: sqlbroker.AsyncBroker) -> None:
        counts = await broker.reap()
        assert counts["sagas_swept"] == 0
        assert counts["released"] == 0

    assert _default_executor_jobs(backend_url, body) == 0


def test_close_keeps_off_the_default_executor(backend_url: str) -> None:
    """``close()`` closes the loop's connections on the loop, and what blocks (the
    blocking pool, opened here on purpose; SQLite's files) on the backend's own threads."""

    async def body(broker: sqlbroker.AsyncBroker) -> None:
        assert broker.backend.schema_version() > 0  # opens the blocking pool
        await broker.send("q", 1)
        await broker.close()

    assert _default_executor_jobs(backend_url, body) == 0
    with sqlbroker.Broker(backend_url) as check:
        assert len(check.pending("q")) == 1


@pytest.mark.postgres
def test_first_use_and_migrate_keep_off_the_default_executor(
    empty_postgres: str,
) -> None:
    """The first operations (ten at once) read the schema version on the loop and migrate
    (a blocking runner) on the backend's own threads; ``migrate()`` likewise."""

    async def scenario() -> int:
        asyncio.get_running_loop().set_default_executor(_CountingExecutor())
        before = _CountingExecutor.submitted
        async with sqlbroker.AsyncBroker(empty_postgres, migrate=True) as broker:
            await asyncio.gather(*(broker.send("q", n) for n in range(10)))
            assert await broker.migrate() == []
        async with sqlbroker.AsyncBroker(empty_postgres) as broker:
            assert len(await broker.pending("q")) == 10
        return _CountingExecutor.submitted - before

    assert asyncio.run(scenario()) == 0


def test_migrate_keeps_off_the_default_executor(backend_url: str) -> None:
    async def body(broker: sqlbroker.AsyncBroker) -> None:
        assert await broker.migrate() == []

    assert _default_executor_jobs(backend_url, body) == 0


def test_many_waiting_results_share_one_source(backend_url: str) -> None:
    """Forty coroutines wait for their results while a worker runs on the same loop: each
    gets its value, and (PostgreSQL) the connections stay those of the pools and the one
    result listener, not one per waiter."""
    application = f"sqlbroker-waiters-{uuid.uuid4().hex[:8]}"
    options = {"application_name": application} if backend_url.startswith("postgres") else {}
    seen: list[int] = []

    async def scenario() -> list[Any]:
        async with sqlbroker.AsyncBroker(
            backend_url, migrate=True, pool_size=4, **options
        ) as broker:

            @broker.subscriber(queue="square", concurrency=4)
            async def square(message: sqlbroker.Message) -> int:
                return int(message.payload) ** 2

            ids = await broker.send_many("square", list(range(40)))
            waiting = [asyncio.ensure_future(broker.result(i, wait=120)) for i in ids]
            for _ in range(1200):  # until each has looked once and sleeps on the hub
                if len(broker.backend.result_hub._waiters) == len(ids):
                    break
                await asyncio.sleep(0.05)
            if options:
                seen.append(_connections(backend_url, application))
            await broker.run_until_idle(timeout=120)
            return await asyncio.gather(*waiting)

    found = asyncio.run(scenario())
    assert [r.value for r in found] == [n * n for n in range(40)]
    assert all(count <= 2 * 4 + 2 for count in seen), seen


def _connections(url: str, application: str) -> int:
    return loop_resources(url, application)()


def _settled(url: str, application: str, at_most: int) -> int:
    """The count once the server has seen closed sessions go (their backends exit a
    moment after the client hangs up; SQLite's threads, once their work is done)."""
    for _ in range(100):
        count = _connections(url, application)
        if count <= at_most:
            return count
        threading.Event().wait(0.05)
    return count


@pytest.mark.postgres
def test_successive_event_loops_keep_connections_bounded(pg_url: str) -> None:
    """``asyncio.run(broker.send(…))`` 25 times without closing: each loop's pool is closed
    when the next loop comes, so the connections stay within the pool size."""
    application = f"sqlbroker-loops-{uuid.uuid4().hex[:8]}"
    broker = sqlbroker.AsyncBroker(pg_url, application_name=application, pool_size=4)
    counts = []
    for n in range(25):
        asyncio.run(broker.send("q", n))
        counts.append(_connections(pg_url, application))
    assert max(counts) <= 4, counts
    asyncio.run(broker.close())
    assert _settled(pg_url, application, 0) == 0

    async def in_a_block() -> None:
        async with sqlbroker.AsyncBroker(pg_url, application_name=application) as opened:
            await asyncio.gather(*(opened.send("q", n) for n in range(20)))

    asyncio.run(in_a_block())
    assert _settled(pg_url, application, 0) == 0
    with sqlbroker.Broker(pg_url) as check:
        assert len(check.pending("q")) == 45


def test_async_broker_runs_subscribers_on_the_callers_loop(backend_url: str) -> None:
    handled: list[int] = []

    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:

            @broker.subscriber(queue="jobs", concurrency=2)
            async def job(message: sqlbroker.Message) -> int:
                handled.append(message.payload)
                return int(message.payload) * 2

            ids = await broker.send_many("jobs", list(range(6)))
            await broker.run_until_idle(timeout=30)
            results = [await broker.result(i) for i in ids]
            assert [r.value for r in results if r is not None] == [0, 2, 4, 6, 8, 10]

            task = asyncio.ensure_future(broker.run(install_signal_handlers=False))
            await broker.send("jobs", 6)
            for _ in range(600):
                if 6 in handled:
                    break
                await asyncio.sleep(0.05)
            broker.stop()
            await task

    asyncio.run(scenario())
    assert sorted(handled) == list(range(7))


@pytest.fixture
def empty_postgres(pg_server: Any) -> Iterator[str]:
    name = f"sqlbroker_empty_{uuid.uuid4().hex[:12]}"
    pg_server.create_database(name)
    try:
        yield pg_server.url(name)
    finally:
        pg_server.drop_database(name)


@pytest.mark.postgres
def test_reading_properties_runs_nothing(empty_postgres: str) -> None:
    """``broker.backend`` (and every other property) only reads: with ``migrate=True`` the
    first operation migrates, or ``migrate()`` — never a property."""
    with sqlbroker.Broker(empty_postgres, migrate=True) as broker:
        for name in ("backend", "url", "limits", "lease", "sagas", "result_ttl"):
            getattr(broker, name)
        assert broker.backend.schema_version() == 0
        assert broker.schema_version() == 0
        broker.send("q", 1)
        assert broker.schema_version() > 0

    async def scenario() -> int:
        async with sqlbroker.AsyncBroker(empty_postgres) as broker:
            broker.backend  # noqa: B018
            return await broker.schema_version()

    assert asyncio.run(scenario()) > 0


def test_a_run_leaves_nothing_behind_however_it_ends(backend_url: str) -> None:
    """A run hands its worker publish hints and ``stop()`` only while it runs: when it
    returns (either face) or its task is cancelled (``AsyncBroker``), the listener is
    gone and ``stop()`` has no worker to reach."""
    with sqlbroker.Broker(backend_url, migrate=True) as broker:

        @broker.subscriber(queue="jobs")
        def job(message: sqlbroker.Message) -> None: ...

        broker.send("jobs", 1)
        broker.run_until_idle(timeout=30)
        assert (broker._publish_listeners, broker._worker) == ([], None)

    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:

            @broker.subscriber(queue="jobs")
            async def job(message: sqlbroker.Message) -> None: ...

            task = asyncio.ensure_future(broker.run(install_signal_handlers=False))
            for _ in range(600):
                if broker._worker is not None:
                    break
                await asyncio.sleep(0.05)
            assert len(broker._publish_listeners) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (broker._publish_listeners, broker._worker) == ([], None)

    asyncio.run(scenario())


def test_calls_whose_first_check_fails_leave_no_loop_resources(
    backend_url: str, request: pytest.FixtureRequest
) -> None:
    """``asyncio.run(broker.publish(…))`` on a schema newer than this sqlbroker, 20 times:
    each call raises ``SchemaError`` and lets go of what it opened for its loop
    (PostgreSQL's sessions, SQLite's threads), which that loop, gone, would never use
    again; they do not wait for the next loop or ``close()``."""
    application = f"sqlbroker-refused-{uuid.uuid4().hex[:8]}"
    newer = (
        "INSERT INTO sqlbroker_schema_version (version, name, applied_at)"
        " VALUES (9999, 'from a newer sqlbroker', CURRENT_TIMESTAMP)"
    )
    if backend_url.startswith("sqlite"):
        with sqlbroker.Broker(backend_url, migrate=True) as admin, admin.backend.begin() as tx:
            tx.connection.execute(newer)
    else:
        import psycopg

        # As the superuser: the runtime login (SQLBROKER_TEST_PG_ROLE) may not write it.
        dbname = psycopg.conninfo.conninfo_to_dict(backend_url)["dbname"]
        superuser_url = request.getfixturevalue("pg_server").url(str(dbname))
        with psycopg.connect(superuser_url, autocommit=True) as conn:
            conn.execute(newer)
    before = _connections(backend_url, application)  # SQLite: other brokers' threads
    named = {} if backend_url.startswith("sqlite") else {"application_name": application}
    broker = sqlbroker.AsyncBroker(backend_url, migrate=False, **named)
    counts = []
    for n in range(20):
        with pytest.raises(sqlbroker.SchemaError, match="upgrade sqlbroker"):
            asyncio.run(broker.publish("orders.created", n))
        counts.append(_settled(backend_url, application, before) - before)
    asyncio.run(broker.close())
    # At most as many as before: on SQLite, threads of a broker closed before may still
    # have been on their way out when the first count was taken.
    assert max(counts) <= 0, counts
