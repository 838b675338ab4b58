"""procrastinate on its async psycopg 3 connector, as its docs show.

Publishing: ``defer_async`` for one job, ``batch_defer_async`` for a batch (one statement).
Consuming: its worker, ``run_worker_async(concurrency=4)`` — ``wait=False`` to drain (it
returns once the queue is empty), LISTEN/NOTIFY on for latency. Its worker fetches one job
per call (it has no batch claim), so both drain workloads run the same worker; finished jobs
stay in its jobs table as ``succeeded`` (its default ``delete_jobs="never"``, comparable to
sqlbroker's archive).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from harness import (
    IDLE_SETTLE,
    QUEUE,
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
    remote_workloads,
    timed_batches,
    timed_single,
)

NAME = "procrastinate"
BACKENDS = ("postgresql",)


def _app(url: str, on_job: Callable[[int, dict[str, Any]], None] | None = None) -> Any:
    import procrastinate

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="bench", queue=QUEUE, pass_context=True)
    async def handle(context: Any, **body: Any) -> None:
        if on_job is not None:
            on_job(context.job.id, body)

    app.bench_task = handle  # type: ignore[attr-defined]
    return app


async def _count(app: Any, status: str) -> int:
    async with app.connector.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = %s", (status,)
        )
        row = await cursor.fetchone()
    return int(row[0])


def _run(database: Database, body: Callable[[Any, asyncio.AbstractEventLoop], Any]) -> Any:
    """Open the app on a private event loop, apply the schema, run ``body(app, loop)``."""
    loop = asyncio.new_event_loop()
    app = _app(database.url)
    loop.run_until_complete(app.open_async())
    try:
        loop.run_until_complete(app.schema_manager.apply_schema_async())
        return body(app, loop)
    finally:
        loop.run_until_complete(app.close_async())
        loop.close()


def publish_single(database: Database, sizes: Sizes) -> Sample:
    def body(app: Any, loop: asyncio.AbstractEventLoop) -> Sample:
        defer = app.bench_task.defer_async
        sample = timed_single(lambda i: loop.run_until_complete(defer(**payload(i))), sizes)
        found = loop.run_until_complete(_count(app, "todo"))
        check_published(found, sizes, sizes.publish_single)
        return sample

    return _run(database, body)


def publish_batch(database: Database, sizes: Sizes) -> Sample:
    def body(app: Any, loop: asyncio.AbstractEventLoop) -> Sample:
        batch = app.bench_task.batch_defer_async
        sample = timed_batches(
            lambda seqs: loop.run_until_complete(batch(*[payload(i) for i in seqs])), sizes
        )
        found = loop.run_until_complete(_count(app, "todo"))
        check_published(found, sizes, sample.details["messages"])
        return sample

    return _run(database, body)


def drain_claim(batch: int) -> Callable[[Database, Sizes], Sample]:
    async def drain_async(database: Database, sizes: Sizes) -> Sample:
        handled: list[int] = []
        app = _app(database.url, lambda job_id, _: handled.append(job_id))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for start in range(0, sizes.drain, 1000):
                seqs = range(start, min(sizes.drain, start + 1000))
                await app.bench_task.batch_defer_async(*[payload(i) for i in seqs])
            async with app.connector.pool.connection() as conn:
                await conn.execute("ANALYZE procrastinate_jobs")
            started = time.perf_counter()
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=sizes.drain_threads,
                wait=False,
                install_signal_handlers=False,
            )
            elapsed = time.perf_counter() - started
            check_drained(handled, sizes.drain, await _count(app, "todo"))
            if await _count(app, "succeeded") != sizes.drain:
                raise RuntimeError("procrastinate: not every job succeeded")
        return Sample(
            {"rate": sizes.drain / elapsed},
            {
                "messages": sizes.drain,
                "seconds": round(elapsed, 3),
                "concurrency": sizes.drain_threads,
                "claim_limit": 1,
                "asked_claim_limit": batch,
            },
        )

    return lambda database, sizes: asyncio.run(drain_async(database, sizes))


def latency(database: Database, sizes: Sizes) -> Sample:
    count = int(sizes.latency_rate * sizes.latency_seconds)

    def body(app: Any, loop: asyncio.AbstractEventLoop) -> Sample:
        defer = app.bench_task.defer_async
        loop.run_until_complete(defer(warmup=True))
        args = [NAME, "latency", "--url", database.url, "--expect", str(count)]
        args += ["--concurrency", str(sizes.worker_concurrency)]
        with Consumer(*args, timeout=sizes.latency_seconds + 60) as consumer:
            consumer.read_event("ready")
            time.sleep(IDLE_SETTLE)
            paced = publish_paced(
                lambda i: loop.run_until_complete(defer(**payload(i))),
                rate=sizes.latency_rate,
                seconds=sizes.latency_seconds,
            )
            done = consumer.finish()
        return latency_sample(done["arrivals"], paced)

    return _run(database, body)


IMPLEMENTATIONS: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.single": publish_single,
    "publish.batch": publish_batch,
    "drain.claim10": drain_claim(10),
    "drain.claim100": drain_claim(100),
    "latency": latency,
}
WORKLOADS = remote_workloads(NAME, ("publish.single", "publish.batch", "drain.claim10", "latency"))


def consume(args: argparse.Namespace) -> None:
    arrivals: list[tuple[int, float, float]] = []

    async def run() -> None:
        finished = asyncio.Event()

        def on_job(_: int, body: dict[str, Any]) -> None:
            now = time.time()
            if body.get("warmup"):
                emit("ready")
                return
            arrivals.append((body["seq"], body["t"], now))
            if len(arrivals) >= args.expect:
                finished.set()

        app = _app(args.url, on_job)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=[QUEUE], concurrency=args.concurrency, install_signal_handlers=False
                )
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), args.timeout)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    asyncio.run(run())
    emit("done", arrivals=arrivals)
