"""huey with its SQLite storage (``SqliteHuey``), the embedded peer for the SQLite targets.

Used as its docs show: calling a ``@huey.task()`` enqueues it (one transaction per task: huey
has no batch enqueue, so ``publish.batch`` is a loop of single enqueues), and its consumer
(``huey.create_consumer``, 4 worker threads) runs them, dequeuing one task per transaction
(no batch claim: it runs ``drain.claim10`` only). WAL with ``synchronous`` set as the target
asks (its ``fsync`` switch only knows FULL and OFF, so the storage sets the pragma). The
consumer polls when idle; its polling is set to 10 ms growing to at most 50 ms (defaults
100 ms growing to 10 s), near sqlbroker's own SQLite polling.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
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

from systems.peer_common import check_drained, check_published, remote_workloads, timed_single

NAME = "huey"
BACKENDS = ("sqlite",)
POLLING = {"initial_delay": 0.01, "backoff": 1.15, "max_delay": 0.05}


def _huey(path: str, synchronous: str, on_job: Callable[[str, dict[str, Any]], None]) -> Any:
    from huey import SqliteHuey
    from huey.storage import SqliteStorage

    logging.getLogger("huey").setLevel(logging.WARNING)

    class Storage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> sqlite3.Connection:
            conn = super()._create_connection()
            conn.execute(f"PRAGMA synchronous={synchronous}")
            return conn

    huey = SqliteHuey(name="bench", filename=path, storage_class=Storage, results=False)

    @huey.task(name="bench", context=True)
    def handle(task: Any = None, **body: Any) -> None:
        on_job(task.id, body)

    huey.bench_task = handle
    return huey


def _pending(path: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT count(*) FROM task").fetchone()[0])


def _open(database: Database, on_job: Callable[[str, dict[str, Any]], None]) -> Any:
    assert database.path is not None
    return _huey(database.path, database.options.get("synchronous", "full"), on_job)


def publish_single(database: Database, sizes: Sizes) -> Sample:
    huey = _open(database, lambda *_: None)
    sample = timed_single(lambda i: huey.bench_task(**payload(i)), sizes)
    assert database.path is not None
    check_published(_pending(database.path), sizes, sizes.publish_single)
    return sample


def publish_batch(database: Database, sizes: Sizes) -> Sample:
    """No batch API: the same number of messages as the others' batches, one by one."""
    huey = _open(database, lambda *_: None)
    for i in range(sizes.warmup):
        huey.bench_task(**payload(i))
    sent = (sizes.publish_batch // sizes.batch_size) * sizes.batch_size
    started = time.perf_counter()
    for i in range(sent):
        huey.bench_task(**payload(i))
    elapsed = time.perf_counter() - started
    assert database.path is not None
    check_published(_pending(database.path), sizes, sent)
    return Sample(
        {"rate": sent / elapsed},
        {"messages": sent, "batch_size": 1, "seconds": round(elapsed, 3)},
    )


def _consumer(huey: Any, workers: int) -> Any:
    return huey.create_consumer(workers=workers, worker_type="thread", periodic=False, **POLLING)


def drain(database: Database, sizes: Sizes) -> Sample:
    handled: list[str] = []
    done = threading.Event()

    def on_job(task_id: str, _: dict[str, Any]) -> None:
        handled.append(task_id)
        if len(handled) >= sizes.drain:
            done.set()

    huey = _open(database, on_job)
    for i in range(sizes.drain):
        huey.bench_task(**payload(i))
    consumer = _consumer(huey, sizes.drain_threads)
    started = time.perf_counter()
    consumer.start()
    done.wait(timeout=600)
    elapsed = time.perf_counter() - started
    consumer.stop(graceful=True)
    assert database.path is not None
    check_drained(handled, sizes.drain, _pending(database.path))
    return Sample(
        {"rate": sizes.drain / elapsed},
        {
            "messages": sizes.drain,
            "seconds": round(elapsed, 3),
            "workers": sizes.drain_threads,
            "claim_limit": 1,
        },
    )


def latency(database: Database, sizes: Sizes) -> Sample:
    count = int(sizes.latency_rate * sizes.latency_seconds)
    huey = _open(database, lambda *_: None)
    huey.bench_task(warmup=True)
    args = [NAME, "latency", "--url", database.url, "--expect", str(count)]
    args += ["--option", f"synchronous={database.options.get('synchronous', 'full')}"]
    args += ["--concurrency", str(sizes.worker_concurrency)]
    with Consumer(*args, timeout=sizes.latency_seconds + 60) as consumer:
        consumer.read_event("ready")
        time.sleep(IDLE_SETTLE)
        paced = publish_paced(
            lambda i: huey.bench_task(**payload(i)),
            rate=sizes.latency_rate,
            seconds=sizes.latency_seconds,
        )
        done = consumer.finish()
    return latency_sample(done["arrivals"], paced)


IMPLEMENTATIONS: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.single": publish_single,
    "publish.batch": publish_batch,
    "drain.claim10": drain,
    "latency": latency,
}
WORKLOADS = remote_workloads(NAME, tuple(IMPLEMENTATIONS))


def consume(args: argparse.Namespace) -> None:
    options = dict(option.split("=", 1) for option in args.option)
    arrivals: list[tuple[int, float, float]] = []
    finished = threading.Event()

    def on_job(_: str, body: dict[str, Any]) -> None:
        now = time.time()
        if body.get("warmup"):
            emit("ready")
            return
        arrivals.append((body["seq"], body["t"], now))
        if len(arrivals) >= args.expect:
            finished.set()

    path = args.url.removeprefix("sqlite:///")
    huey = _huey(path, options.get("synchronous", "full"), on_job)
    consumer = _consumer(huey, args.concurrency)
    consumer.start()
    finished.wait(timeout=args.timeout)
    consumer.stop(graceful=True)
    emit("done", arrivals=arrivals)
