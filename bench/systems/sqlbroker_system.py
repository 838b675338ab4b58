"""sqlbroker under test, through its public API only (``Broker``: ``send``, ``send_many``,
``claim``, ``complete``, ``@subscriber`` and ``run_until_idle`` / ``run``)."""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from harness import (
    IDLE_SETTLE,
    QUEUE,
    BenchError,
    Consumer,
    Database,
    Sample,
    Sizes,
    call_timings,
    emit,
    latency_sample,
    payload,
    percentile,
    publish_paced,
)

from sqlbroker import Broker, Message

NAME = "sqlbroker"
BACKENDS = ("sqlite", "postgresql")
PREPUBLISH_BATCH = 1000


def open_broker(database: Database) -> Broker:
    return Broker(database.url, migrate=True, **database.options)


def _backend_args(database: Database) -> list[str]:
    args = ["--url", database.url]
    for name, value in database.options.items():
        args += ["--option", f"{name}={value}"]
    return args


# --- verification (raw SQL: the public API pages at most 10 000 archive rows) ---------------


def _query(database: Database, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if database.backend == "sqlite":
        assert database.path is not None
        with contextlib.closing(sqlite3.connect(database.path)) as conn:
            return list(conn.execute(sql.replace("%s", "?"), params))
    import psycopg

    with psycopg.connect(database.url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def verify_drained(database: Database, published: list[str]) -> None:
    """Every published message is in the archive as completed exactly once, and none is
    left in the hot table."""
    rows = _query(
        database,
        "SELECT CAST(message_id AS text) FROM sqlbroker_archive"
        " WHERE subscription = %s AND outcome = 'completed'",
        (QUEUE,),
    )
    completed = [row[0] for row in rows]
    if len(completed) != len(set(completed)):
        raise BenchError(f"{len(completed) - len(set(completed))} messages completed twice")
    if set(completed) != set(published):
        raise BenchError(
            f"completed {len(completed)} of {len(published)} published"
            f" ({len(set(published) - set(completed))} missing)"
        )
    left = _query(
        database, "SELECT count(*) FROM sqlbroker_message WHERE subscription = %s", (QUEUE,)
    )[0][0]
    if left:
        raise BenchError(f"{left} messages are still in the queue")


def _analyze(database: Database) -> None:
    """Planner statistics, as autovacuum keeps them on a running PostgreSQL (SQLite never
    analyzes on its own, so it is left as a user would have it)."""
    if database.backend == "postgresql":
        _query(database, "ANALYZE sqlbroker_message", ())


def prepublish(database: Database, count: int) -> list[str]:
    with open_broker(database) as broker:
        ids: list[str] = []
        for start in range(0, count, PREPUBLISH_BATCH):
            size = min(PREPUBLISH_BATCH, count - start)
            ids += broker.send_many(QUEUE, [payload(start + i) for i in range(size)])
    _analyze(database)
    return ids


# --- publish ---------------------------------------------------------------------------------


def _check_ready(broker: Broker, expected: int) -> None:
    ready = {s.subscription: s.ready for s in broker.stats()}.get(QUEUE, 0)
    if ready != expected:
        raise BenchError(f"{ready} messages ready after publishing {expected}")


def publish_single(database: Database, sizes: Sizes) -> Sample:
    with open_broker(database) as broker:
        for i in range(sizes.warmup):
            broker.send(QUEUE, payload(i))
        timings: list[float] = []
        started = time.perf_counter()
        for i in range(sizes.publish_single):
            before = time.perf_counter()
            broker.send(QUEUE, payload(i))
            timings.append(time.perf_counter() - before)
        elapsed = time.perf_counter() - started
        _check_ready(broker, sizes.warmup + sizes.publish_single)
    return Sample(
        {"rate": sizes.publish_single / elapsed},
        {
            "messages": sizes.publish_single,
            "seconds": round(elapsed, 3),
            "send_p50_ms": round(percentile(timings, 0.5) * 1000, 3),
            "send_p99_ms": round(percentile(timings, 0.99) * 1000, 3),
        },
    )


def publish_batch(database: Database, sizes: Sizes) -> Sample:
    with open_broker(database) as broker:
        broker.send_many(QUEUE, [payload(i) for i in range(sizes.warmup)])
        batches = sizes.publish_batch // sizes.batch_size
        started = time.perf_counter()
        for b in range(batches):
            base = b * sizes.batch_size
            broker.send_many(QUEUE, [payload(base + i) for i in range(sizes.batch_size)])
        elapsed = time.perf_counter() - started
        sent = batches * sizes.batch_size
        _check_ready(broker, sizes.warmup + sent)
    return Sample(
        {"rate": sent / elapsed},
        {"messages": sent, "batch_size": sizes.batch_size, "seconds": round(elapsed, 3)},
    )


# --- drain -----------------------------------------------------------------------------------


def drain_runtime(database: Database, sizes: Sizes) -> Sample:
    published = prepublish(database, sizes.drain)
    args = [NAME, "drain", *_backend_args(database)]
    args += ["--concurrency", str(sizes.worker_concurrency), "--expect", str(sizes.drain)]
    with Consumer(*args, timeout=600) as consumer:
        done = consumer.finish()
    if done["handled"] != sizes.drain or done["distinct"] != sizes.drain:
        raise BenchError(f"handler ran {done['handled']} times on {done['distinct']} messages")
    verify_drained(database, published)
    wall = done["t_end"] - done["t_start"]
    busy = done["t_last"] - done["t_start"]
    return Sample(
        {"rate": sizes.drain / wall},
        {
            "messages": sizes.drain,
            "seconds": round(wall, 3),
            "rate_to_last_handler": round(sizes.drain / busy, 1),
            "startup_s": round(done["t_first"] - done["t_start"], 3),
            "idle_detection_and_shutdown_s": round(done["t_end"] - done["t_last"], 3),
            "concurrency": sizes.worker_concurrency,
            **_call_summary(done["calls"]),
        },
    )


def _call_summary(calls: dict[str, dict[str, float]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, short in (("message_claim_many", "claim"), ("message_complete_many", "complete")):
        stats = calls.get(name)
        if stats and stats["calls"]:
            summary[f"{short}_calls"] = int(stats["calls"])
            summary[f"{short}_mean_rows"] = round(stats["rows"] / stats["calls"], 2)
            summary[f"{short}_mean_ms"] = round(stats["seconds"] / stats["calls"] * 1000, 3)
    return summary


def drain_claim(batch: int) -> Callable[[Database, Sizes], Sample]:
    def drain(database: Database, sizes: Sizes) -> Sample:
        published = prepublish(database, sizes.drain)
        consumed: list[str] = []
        errors: list[BaseException] = []
        timings: dict[str, list[float]] = {"claim": [], "complete": []}
        gate = threading.Barrier(sizes.drain_threads + 1)
        with open_broker(database) as broker:
            broker.stats()  # open the pool before the clock starts

            def loop() -> None:
                mine: list[str] = []
                claim_s: list[float] = []
                complete_s: list[float] = []
                try:
                    gate.wait()
                    while True:
                        started = time.perf_counter()
                        deliveries = broker.claim(QUEUE, limit=batch)
                        claim_s.append(time.perf_counter() - started)
                        if not deliveries:
                            break
                        started = time.perf_counter()
                        broker.complete(deliveries)
                        complete_s.append(time.perf_counter() - started)
                        mine += [d.message_id for d in deliveries]
                except BaseException as error:
                    errors.append(error)
                consumed.extend(mine)
                timings["claim"] += claim_s
                timings["complete"] += complete_s

            threads = [threading.Thread(target=loop) for _ in range(sizes.drain_threads)]
            for thread in threads:
                thread.start()
            gate.wait()
            started = time.perf_counter()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - started
        if errors:
            raise BenchError(f"a consumer thread failed: {errors[0]!r}")
        if len(consumed) != len(set(consumed)):
            raise BenchError("a message was claimed twice")
        verify_drained(database, published)
        return Sample(
            {"rate": sizes.drain / elapsed},
            {
                "messages": sizes.drain,
                "seconds": round(elapsed, 3),
                "threads": sizes.drain_threads,
                "claim_limit": batch,
                **call_timings(timings),
            },
        )

    return drain


# --- latency ---------------------------------------------------------------------------------


def latency(database: Database, sizes: Sizes) -> Sample:
    count = int(sizes.latency_rate * sizes.latency_seconds)
    with open_broker(database) as broker:
        broker.send(QUEUE, {"warmup": True, "t": time.time()})
        args = [NAME, "latency", *_backend_args(database)]
        args += ["--concurrency", str(sizes.worker_concurrency), "--expect", str(count)]
        with Consumer(*args, timeout=sizes.latency_seconds + 60) as consumer:
            consumer.read_event("ready")
            time.sleep(IDLE_SETTLE)
            paced = publish_paced(
                lambda i: broker.send(QUEUE, payload(i)),
                rate=sizes.latency_rate,
                seconds=sizes.latency_seconds,
            )
            done = consumer.finish()
    return latency_sample(done["arrivals"], paced)


WORKLOADS: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.single": publish_single,
    "publish.batch": publish_batch,
    "drain.runtime": drain_runtime,
    "drain.claim10": drain_claim(10),
    "drain.claim100": drain_claim(100),
    "latency": latency,
}


# --- the consumer process --------------------------------------------------------------------


def count_calls(broker: Broker, names: list[str]) -> dict[str, dict[str, float]]:
    """Count the runtime's storage calls (and the rows they returned) for the report, by
    wrapping the backend's bound methods on this instance; sqlbroker is not modified."""
    backend = broker.backend
    counts: dict[str, dict[str, float]] = {}
    for name in names:
        original = getattr(backend, name)
        stats = counts.setdefault(name, {"calls": 0, "rows": 0, "seconds": 0.0})

        def counted(*a: Any, _original: Any = original, _stats: Any = stats, **k: Any) -> Any:
            started = time.perf_counter()
            found = _original(*a, **k)
            _stats["seconds"] += time.perf_counter() - started
            _stats["calls"] += 1
            _stats["rows"] += len(found)
            return found

        setattr(backend, name, counted)
    return counts


def consume(args: argparse.Namespace) -> None:
    options = dict(option.split("=", 1) for option in args.option)
    broker = Broker(args.url, **options)
    handled: list[int] = []
    arrivals: list[tuple[int, float, float]] = []
    marks: dict[str, float] = {}

    if args.mode == "drain":
        calls = count_calls(broker, ["message_claim_many", "message_complete_many"])

        @broker.subscriber(queue=QUEUE, concurrency=args.concurrency, prefetch=args.prefetch)
        async def drain(message: Message) -> None:
            marks.setdefault("first", time.time())
            handled.append(message.delivery_id)
            marks["last"] = time.time()

        marks["start"] = time.time()
        broker.run_until_idle(timeout=args.timeout)
        marks["end"] = time.time()
        emit(
            "done",
            handled=len(handled),
            distinct=len(set(handled)),
            t_start=marks["start"],
            t_first=marks.get("first", marks["end"]),
            t_last=marks.get("last", marks["end"]),
            t_end=marks["end"],
            calls=calls,
        )
    else:

        @broker.subscriber(queue=QUEUE, concurrency=args.concurrency, prefetch=args.prefetch)
        async def measure(message: Message) -> None:
            now = time.time()
            body = message.payload
            if body.get("warmup"):
                emit("ready")
                return
            arrivals.append((body["seq"], body["t"], now))
            if len(arrivals) >= args.expect:
                broker.stop()

        broker.run(timeout=args.timeout, install_signal_handlers=False)
        emit("done", arrivals=arrivals)
    broker.close()
