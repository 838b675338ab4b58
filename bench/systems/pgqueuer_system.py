"""pgqueuer on asyncpg, the driver its docs lead with.

Used as its docs show for throughput: ``Queries.enqueue`` with one job, or with lists for a
batch (one statement); consumers are ``QueueManager``\\ s with ``batch_size`` = the claim
batch, run in ``drain`` mode (they exit when the queue is empty) for the drains, and in
``continuous`` mode, woken by its insert trigger's NOTIFY, for latency. pgqueuer acks in
batches by its own buffer (the finished job moves to its log table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from harness import (
    IDLE_SETTLE,
    Consumer,
    Database,
    Sample,
    Sizes,
    emit,
    latency_sample,
    payload,
    publish_paced,
)

from systems.peer_common import (
    check_drained,
    check_published,
    encode,
    remote_workloads,
    timed_batches,
    timed_single_async,
)

NAME = "pgqueuer"
BACKENDS = ("postgresql",)
ENTRYPOINT = "bench"


async def _connect(url: str) -> Any:
    import asyncpg

    return await asyncpg.connect(url)


def _queries(connection: Any) -> Any:
    from pgqueuer.queries import Queries

    return Queries.from_asyncpg_connection(connection)


async def _count(connection: Any) -> int:
    return int(await connection.fetchval("SELECT count(*) FROM pgqueuer"))


async def _setup(database: Database) -> tuple[Any, Any]:
    connection = await _connect(database.url)
    queries = _queries(connection)
    await queries.install()
    return connection, queries


async def _enqueue_many(queries: Any, seqs: list[int]) -> None:
    await queries.enqueue(
        [ENTRYPOINT] * len(seqs), [encode(payload(i)) for i in seqs], [0] * len(seqs)
    )


def publish_single(database: Database, sizes: Sizes) -> Sample:
    """Sequential ``await queries.enqueue(...)`` in one coroutine (one event loop, as an
    async application calls it)."""

    async def run() -> Sample:
        connection, queries = await _setup(database)
        sample = await timed_single_async(
            lambda i: queries.enqueue(ENTRYPOINT, encode(payload(i))), sizes
        )
        check_published(await _count(connection), sizes, sizes.publish_single)
        await connection.close()
        return sample

    return asyncio.run(run())


def publish_batch(database: Database, sizes: Sizes) -> Sample:
    loop = asyncio.new_event_loop()
    connection, queries = loop.run_until_complete(_setup(database))
    sample = timed_batches(
        lambda seqs: loop.run_until_complete(_enqueue_many(queries, seqs)), sizes
    )
    found = loop.run_until_complete(_count(connection))
    check_published(found, sizes, sample.details["messages"])
    loop.run_until_complete(connection.close())
    loop.close()
    return sample


def _manager(connection: Any, handled: list[Any], on_job: Callable[[Any], None] | None) -> Any:
    from pgqueuer.qm import QueueManager

    manager = QueueManager(_queries(connection))

    @manager.entrypoint(ENTRYPOINT)
    async def handle(job: Any) -> None:
        body = json.loads(job.payload)
        handled.append(job.id)
        if on_job is not None:
            on_job(body)

    return manager


def drain_claim(batch: int) -> Callable[[Database, Sizes], Sample]:
    async def drain_async(database: Database, sizes: Sizes) -> Sample:
        from pgqueuer.types import QueueExecutionMode

        connection, queries = await _setup(database)
        for start in range(0, sizes.drain, 1000):
            await _enqueue_many(queries, list(range(start, min(sizes.drain, start + 1000))))
        await connection.execute("ANALYZE pgqueuer")
        handled: list[Any] = []
        connections = [await _connect(database.url) for _ in range(sizes.drain_threads)]
        managers = [_manager(c, handled, None) for c in connections]
        started = time.perf_counter()
        await asyncio.gather(
            *(
                m.run(
                    batch_size=batch,
                    mode=QueueExecutionMode.drain,
                    dequeue_timeout=timedelta(seconds=1),
                )
                for m in managers
            )
        )
        elapsed = time.perf_counter() - started
        check_drained(handled, sizes.drain, await _count(connection))
        for c in [connection, *connections]:
            await c.close()
        return Sample(
            {"rate": sizes.drain / elapsed},
            {
                "messages": sizes.drain,
                "seconds": round(elapsed, 3),
                "consumers": sizes.drain_threads,
                "claim_limit": batch,
            },
        )

    return lambda database, sizes: asyncio.run(drain_async(database, sizes))


def latency(database: Database, sizes: Sizes) -> Sample:
    loop = asyncio.new_event_loop()
    connection, queries = loop.run_until_complete(_setup(database))
    count = int(sizes.latency_rate * sizes.latency_seconds)
    loop.run_until_complete(queries.enqueue(ENTRYPOINT, encode({"warmup": True})))
    args = [NAME, "latency", "--url", database.url, "--expect", str(count)]
    args += ["--concurrency", str(sizes.worker_concurrency)]
    with Consumer(*args, timeout=sizes.latency_seconds + 60) as consumer:
        consumer.read_event("ready")
        time.sleep(IDLE_SETTLE)
        paced = publish_paced(
            lambda i: loop.run_until_complete(queries.enqueue(ENTRYPOINT, encode(payload(i)))),
            rate=sizes.latency_rate,
            seconds=sizes.latency_seconds,
        )
        done = consumer.finish()
    loop.run_until_complete(connection.close())
    loop.close()
    return latency_sample(done["arrivals"], paced)


IMPLEMENTATIONS: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.single": publish_single,
    "publish.batch": publish_batch,
    "drain.claim10": drain_claim(10),
    "drain.claim100": drain_claim(100),
    "latency": latency,
}
WORKLOADS = remote_workloads(NAME)


def consume(args: argparse.Namespace) -> None:
    arrivals: list[tuple[int, float, float]] = []

    async def run() -> None:
        connection = await _connect(args.url)
        handled: list[Any] = []

        def on_job(body: dict[str, Any]) -> None:
            now = time.time()
            if body.get("warmup"):
                emit("ready")
                return
            arrivals.append((body["seq"], body["t"], now))
            if len(arrivals) >= args.expect:
                manager.shutdown.set()

        manager = _manager(connection, handled, on_job)
        await asyncio.wait_for(manager.run(batch_size=10), args.timeout)
        await connection.close()

    asyncio.run(run())
    emit("done", arrivals=arrivals)
