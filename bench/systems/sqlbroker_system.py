"""sqlbroker under test, through its public API only (``Broker``: ``send``, ``send_many``,
``claim``, ``complete``, ``@subscriber`` and ``run_until_idle`` / ``run``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import sqlite3
import sys
import threading
import time
from array import array
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
from workloads import BACKLOGS, PROCESSES

from sqlbroker import AsyncBroker, Broker, Message

NAME = "sqlbroker"
BACKENDS = ("sqlite", "postgresql")
PREPUBLISH_BATCH = 1000


def open_broker(database: Database, **options: Any) -> Broker:
    return Broker(database.url, migrate=True, **database.options, **options)


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


def verify_drained(
    database: Database, published: list[str], acked: list[str] | None = None
) -> None:
    """Every published message is in the archive as completed exactly once (or, with
    ``archive_completed=False``, in ``acked``: the ids the consumers completed), and none
    is left in the hot table."""
    if acked is None:
        rows = _query(
            database,
            "SELECT CAST(message_id AS text) FROM sqlbroker_archive"
            " WHERE subscription = %s AND outcome = 'completed'",
            (QUEUE,),
        )
        completed = [row[0] for row in rows]
    else:
        completed = acked
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


def prepublish(database: Database, count: int, keys: int = 0) -> list[str]:
    """Publish ``count`` messages in batches; with ``keys``, message ``i`` gets the ordering
    key ``k{i % keys}`` (published key by key, each key's messages in ``i`` order)."""
    with open_broker(database) as broker:
        ids: list[str] = []
        if keys:
            for k in range(keys):
                seqs = range(k, count, keys)
                for start in range(0, len(seqs), PREPUBLISH_BATCH):
                    chunk = seqs[start : start + PREPUBLISH_BATCH]
                    ids += broker.send_many(QUEUE, [payload(i) for i in chunk], key=f"k{k}")
        else:
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


ROUTED_TOPIC = "bench.orders.created"
ROUTED_SUBSCRIPTIONS = {"bench-billing": ["bench.orders.#"], "bench-audit": ["bench.*.created"]}


def publish_routed(database: Database, sizes: Sizes) -> Sample:
    with open_broker(database) as broker:
        for name, patterns in ROUTED_SUBSCRIPTIONS.items():
            broker.subscribe(name, patterns)
        for i in range(sizes.warmup):
            broker.publish(ROUTED_TOPIC, payload(i))
        started = time.perf_counter()
        for i in range(sizes.publish_single):
            broker.publish(ROUTED_TOPIC, payload(i))
        elapsed = time.perf_counter() - started
        ready = {s.subscription: s.ready for s in broker.stats()}
        expected = sizes.warmup + sizes.publish_single
        if any(ready.get(name) != expected for name in ROUTED_SUBSCRIPTIONS):
            raise BenchError(f"{ready} ready after publishing {expected} to two subscriptions")
    return Sample(
        {"rate": sizes.publish_single / elapsed},
        {"messages": sizes.publish_single, "copies": 2, "seconds": round(elapsed, 3)},
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


def _check_ready_sql(database: Database, expected: int) -> None:
    """As :func:`_check_ready`, by SQL (an ``AsyncBroker`` may have no sync twin)."""
    rows = _query(
        database,
        "SELECT count(*) FROM sqlbroker_message WHERE subscription = %s AND state = 'available'",
        (QUEUE,),
    )
    if rows[0][0] != expected:
        raise BenchError(f"{rows[0][0]} messages ready after publishing {expected}")


def publish_single_async(database: Database, sizes: Sizes) -> Sample:
    """``await AsyncBroker.send`` one after the other in one coroutine (issue 24's target:
    against pgqueuer's async enqueue)."""

    async def run() -> Sample:
        async with AsyncBroker(database.url, migrate=True, **database.options) as broker:
            for i in range(sizes.warmup):
                await broker.send(QUEUE, payload(i))
            timings: list[float] = []
            started = time.perf_counter()
            for i in range(sizes.publish_single):
                before = time.perf_counter()
                await broker.send(QUEUE, payload(i))
                timings.append(time.perf_counter() - before)
            elapsed = time.perf_counter() - started
        _check_ready_sql(database, sizes.warmup + sizes.publish_single)
        return Sample(
            {"rate": sizes.publish_single / elapsed},
            {
                "messages": sizes.publish_single,
                "seconds": round(elapsed, 3),
                "send_p50_ms": round(percentile(timings, 0.5) * 1000, 3),
                "send_p99_ms": round(percentile(timings, 0.99) * 1000, 3),
            },
        )

    return asyncio.run(run())


def publish_batch_async(database: Database, sizes: Sizes) -> Sample:
    """``await AsyncBroker.send_many`` with batches of ``batch_size``, one after the other."""

    async def run() -> Sample:
        async with AsyncBroker(database.url, migrate=True, **database.options) as broker:
            await broker.send_many(QUEUE, [payload(i) for i in range(sizes.warmup)])
            batches = sizes.publish_batch // sizes.batch_size
            started = time.perf_counter()
            for b in range(batches):
                base = b * sizes.batch_size
                await broker.send_many(QUEUE, [payload(base + i) for i in range(sizes.batch_size)])
            elapsed = time.perf_counter() - started
            sent = batches * sizes.batch_size
        _check_ready_sql(database, sizes.warmup + sent)
        return Sample(
            {"rate": sent / elapsed},
            {"messages": sent, "batch_size": sizes.batch_size, "seconds": round(elapsed, 3)},
        )

    return asyncio.run(run())


# --- drain -----------------------------------------------------------------------------------


def drain_runtime(database: Database, sizes: Sizes) -> Sample:
    return drain_runtime_with(None)(database, sizes)


def drain_runtime_with(prefetch: int | None) -> Callable[[Database, Sizes], Sample]:
    """``drain.runtime`` with the subscriber's ``prefetch`` (``None``: its default)."""

    def run(database: Database, sizes: Sizes) -> Sample:
        return _drain_runtime(database, sizes, prefetch)

    return run


def _drain_runtime(database: Database, sizes: Sizes, prefetch: int | None) -> Sample:
    published = prepublish(database, sizes.drain)
    args = [NAME, "drain", *_backend_args(database)]
    args += ["--concurrency", str(sizes.worker_concurrency), "--expect", str(sizes.drain)]
    if prefetch is not None:
        args += ["--prefetch", str(prefetch)]
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
            "prefetch": prefetch,
            **_call_summary(done["calls"]),
        },
    )


def _call_summary(calls: dict[str, dict[str, float]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    names = (
        ("async_ops.message_claim_many", "claim"),
        ("message_complete_many", "complete"),  # an older tree (bench/compare_trees.py)
        ("message_settle_many", "complete"),
        ("async_ops.message_settle_many", "complete"),  # the write-back, on the loop
    )
    for name, short in names:
        stats = calls.get(name)
        if stats and stats["calls"]:
            summary[f"{short}_calls"] = int(stats["calls"])
            summary[f"{short}_mean_rows"] = round(stats["rows"] / stats["calls"], 2)
            summary[f"{short}_mean_ms"] = round(stats["seconds"] / stats["calls"] * 1000, 3)
    return summary


def drain_claim(
    batch: int, *, keyed: bool = False, archived: bool = True
) -> Callable[[Database, Sizes], Sample]:
    """4 threads looping claim → complete; ``keyed``: an ordering key on every message;
    ``archived=False``: the broker's ``archive_completed=False`` (an ack only deletes)."""

    def drain(database: Database, sizes: Sizes) -> Sample:
        published = prepublish(database, sizes.drain, sizes.keys if keyed else 0)
        consumed: list[str] = []
        errors: list[BaseException] = []
        timings: dict[str, list[float]] = {"claim": [], "complete": []}
        gate = threading.Barrier(sizes.drain_threads + 1)
        with open_broker(database, archive_completed=archived) as broker:
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
        verify_drained(database, published, None if archived else consumed)
        return Sample(
            {"rate": sizes.drain / elapsed},
            {
                "messages": sizes.drain,
                "seconds": round(elapsed, 3),
                "threads": sizes.drain_threads,
                "claim_limit": batch,
                "ordering_keys": sizes.keys if keyed else 0,
                **call_timings(timings),
            },
        )

    return drain


# --- scale (W4) ------------------------------------------------------------------------------


def claim_backlog(count: int, *, keyed: bool = False) -> Callable[[Database, Sizes], Sample]:
    """The time of one ``claim(limit=10)`` with ``count`` messages waiting (each claimed
    batch is completed before the next claim, so the backlog stays put); ``keyed``: every
    message has one of ``sizes.keys`` ordering keys, so each ack promotes its key's next."""

    def run(database: Database, sizes: Sizes) -> Sample:
        prepublish(database, count, sizes.keys if keyed else 0)
        claim_s: list[float] = []
        complete_s: list[float] = []
        seen: set[str] = set()
        with open_broker(database) as broker:
            for round_ in range(sizes.warmup + sizes.claim_samples):
                started = time.perf_counter()
                deliveries = broker.claim(QUEUE, limit=10)
                claimed = time.perf_counter()
                broker.complete(deliveries)
                if round_ >= sizes.warmup:
                    claim_s.append(claimed - started)
                    complete_s.append(time.perf_counter() - claimed)
                if len(deliveries) != 10:
                    raise BenchError(f"claimed {len(deliveries)} of 10 with a backlog")
                seen.update(d.message_id for d in deliveries)
        if len(seen) != 10 * (sizes.warmup + sizes.claim_samples):
            raise BenchError("a message was claimed twice")
        return Sample(
            {"p50": percentile(claim_s, 0.5) * 1000, "p99": percentile(claim_s, 0.99) * 1000},
            {
                "backlog": count,
                "ordering_keys": sizes.keys if keyed else 0,
                "claims": len(claim_s),
                **call_timings({"complete": complete_s}),
            },
        )

    return run


def drain_processes(processes: int) -> Callable[[Database, Sizes], Sample]:
    """``processes`` worker processes (concurrency 4 each) drain the queue together; they
    connect first and start on one signal, the clock runs until the last one is idle."""

    def run(database: Database, sizes: Sizes) -> Sample:
        published = prepublish(database, sizes.drain)
        args = [NAME, "drain", *_backend_args(database), "--gate"]
        args += ["--concurrency", str(sizes.worker_concurrency), "--expect", str(sizes.drain)]
        with contextlib.ExitStack() as stack:
            consumers = [
                stack.enter_context(Consumer(*args, timeout=600, gate=True))
                for _ in range(processes)
            ]
            for consumer in consumers:
                consumer.read_event("ready")
            started = time.time()
            for consumer in consumers:
                consumer.go()
            done = [consumer.finish() for consumer in consumers]
        handled = sum(d["handled"] for d in done)
        if handled != sizes.drain:
            raise BenchError(f"the handlers ran {handled} times for {sizes.drain} messages")
        verify_drained(database, published)
        wall = max(d["t_end"] for d in done) - started
        return Sample(
            {"rate": sizes.drain / wall},
            {
                "messages": sizes.drain,
                "seconds": round(wall, 3),
                "processes": processes,
                "per_process": [d["handled"] for d in done],
                "rate_to_last_handler": round(
                    sizes.drain / (max(d["t_last"] for d in done) - started), 1
                ),
            },
        )

    return run


# --- soak (W6) -------------------------------------------------------------------------------

SOAK_PROBE_SECONDS = 10.0
SOAK_WINDOW_SECONDS = 60.0


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in open(f"/proc/{pid}/status", encoding="ascii"):  # noqa: SIM115
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _table_probe(database: Database) -> tuple[float, int]:
    """The hot table's size (kB, indexes and TOAST included) and its dead tuples."""
    rows = _query(
        database,
        "SELECT pg_total_relation_size('sqlbroker_message') / 1024.0, n_dead_tup"
        " FROM pg_stat_user_tables WHERE relname = 'sqlbroker_message'",
        (),
    )
    return float(rows[0][0]), int(rows[0][1])


def soak(database: Database, sizes: Sizes) -> Sample:
    """A fixed publish rate into a running worker for ``soak_seconds``: nothing may grow
    without bound (the hot table, its dead tuples, the worker's memory) and the latency
    must not drift. The archive grows by design (retention trims it)."""
    count = int(sizes.soak_rate * sizes.soak_seconds)
    limit = sizes.soak_seconds * 1.5 + 60  # the consumer's own deadline (its default: 600 s)
    probes: list[dict[str, float]] = []
    with open_broker(database) as broker:
        broker.send(QUEUE, {"warmup": True, "t": time.time()})
        args = [NAME, "latency", *_backend_args(database), "--timeout", str(limit)]
        args += ["--concurrency", str(sizes.worker_concurrency), "--expect", str(count)]
        with Consumer(*args, timeout=limit + 30) as consumer:
            consumer.read_event("ready")
            stop = threading.Event()
            began = time.monotonic()

            def probe() -> None:
                while not stop.wait(SOAK_PROBE_SECONDS):
                    hot_kb, dead = _table_probe(database)
                    probes.append(
                        {
                            "s": round(time.monotonic() - began, 1),
                            "rss_mb": round(_rss_mb(consumer.process.pid), 1),
                            "hot_kb": round(hot_kb, 1),
                            "dead_tuples": dead,
                        }
                    )

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            paced = publish_paced(
                lambda i: broker.send(QUEUE, payload(i)),
                rate=sizes.soak_rate,
                seconds=sizes.soak_seconds,
            )
            done = consumer.finish()
            stop.set()
            prober.join()
    arrivals = done["arrivals"]
    latency_sample(arrivals, paced)  # the same checks: all arrived, none twice
    start = min(sent for _, sent, _ in arrivals)
    end = max(sent for _, sent, _ in arrivals)
    first = [(a - s) * 1000 for _, s, a in arrivals if s - start < SOAK_WINDOW_SECONDS]
    last = [(a - s) * 1000 for _, s, a in arrivals if end - s < SOAK_WINDOW_SECONDS]
    early = [p for p in probes if p["s"] >= SOAK_WINDOW_SECONDS] or probes
    if not early:
        raise BenchError("the soak is too short to probe")
    return Sample(
        {
            "p99_first_ms": percentile(first, 0.99),
            "p99_last_ms": percentile(last, 0.99),
            "rss_first_mb": early[0]["rss_mb"],
            "rss_last_mb": probes[-1]["rss_mb"],
            "hot_first_kb": early[0]["hot_kb"],
            "hot_last_kb": probes[-1]["hot_kb"],
            "dead_tuples_max": max(p["dead_tuples"] for p in probes),
        },
        {**paced.details, "seconds": sizes.soak_seconds, "probes": probes},
    )


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
    "publish.routed": publish_routed,
    "publish.batch": publish_batch,
    "drain.runtime": drain_runtime,
    "drain.claim10": drain_claim(10),
    "drain.claim100": drain_claim(100),
    "drain.keyed10": drain_claim(10, keyed=True),
    "drain.keyed100": drain_claim(100, keyed=True),
    "drain.unarchived10": drain_claim(10, archived=False),
    "drain.unarchived100": drain_claim(100, archived=False),
    "latency": latency,
    **{f"claim.backlog.{label}": claim_backlog(n) for n, label in BACKLOGS.items()},
    **{
        f"claim.backlog.keyed.{label}": claim_backlog(n, keyed=True)
        for n, label in BACKLOGS.items()
    },
    **{f"drain.processes.{n}": drain_processes(n) for n in PROCESSES},
    "soak": soak,
}
TARGET_WORKLOADS: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.single.async": publish_single_async,
    "publish.batch": publish_batch,
    "publish.batch.async": publish_batch_async,
    "drain.runtime.prefetch10": drain_runtime_with(10),
}
"""What ``bench/targets.py`` measures of sqlbroker (issue 24's targets)."""
POSTGRESQL_ONLY = ("claim.backlog.", "drain.processes.", "soak")
"""W4 and W6 run on the durable PostgreSQL target (the production setting) only: on a
2-core box each takes minutes."""


def runs_on(workload: str, target: str) -> bool:
    return target == "postgresql" or not workload.startswith(POSTGRESQL_ONLY)


# --- the consumer process --------------------------------------------------------------------


def count_calls(broker: Broker, names: list[str]) -> dict[str, dict[str, float]]:
    """Count the runtime's storage calls (and the rows they returned) for the report, by
    wrapping the backend's bound methods on this instance; sqlbroker is not modified."""
    counts: dict[str, dict[str, float]] = {}
    for name in names:
        *path, attribute = name.split(".")
        owner: Any = broker.backend
        for part in path:
            owner = getattr(owner, part, None)
        original = getattr(owner, attribute, None)
        if original is None:  # an older tree (bench/compare_trees.py): not counted
            continue
        stats = counts.setdefault(name, {"calls": 0, "rows": 0, "seconds": 0.0})

        def tally(found: Any, started: float, stats: dict[str, float]) -> Any:
            stats["seconds"] += time.perf_counter() - started
            stats["calls"] += 1
            stats["rows"] += len(found)
            return found

        def counted(*a: Any, _original: Any = original, _stats: Any = stats, **k: Any) -> Any:
            # An operation of the backend's async executor returns a coroutine (the same
            # descriptor serves both executors), an older tree's was a coroutine function.
            started = time.perf_counter()
            result = _original(*a, **k)
            if not inspect.isawaitable(result):
                return tally(result, started, _stats)

            async def finish(result: Any = result) -> Any:
                return tally(await result, started, _stats)

            return finish()

        setattr(owner, attribute, counted)
    return counts


def consume(args: argparse.Namespace) -> None:
    options = dict(option.split("=", 1) for option in args.option)
    broker = Broker(args.url, **options)
    handled: list[int] = []
    # Arrivals are kept in flat arrays (24 bytes each): in a 10-minute soak a list of tuples
    # would add ~19 MB to the worker's RSS, which the soak measures.
    seqs, sent, arrived = array("q"), array("d"), array("d")
    marks: dict[str, float] = {}

    if args.mode == "drain":
        calls = count_calls(
            broker,
            [
                "async_ops.message_claim_many",
                "message_complete_many",
                "message_settle_many",
                "async_ops.message_settle_many",
            ],
        )

        @broker.subscriber(queue=QUEUE, concurrency=args.concurrency, prefetch=args.prefetch)
        async def drain(message: Message) -> None:
            marks.setdefault("first", time.time())
            handled.append(message.delivery_id)
            marks["last"] = time.time()

        if args.gate:
            broker.stats()  # connect and check the schema before the start signal
            emit("ready")
            sys.stdin.readline()
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
            seqs.append(body["seq"])
            sent.append(body["t"])
            arrived.append(now)
            if len(seqs) >= args.expect:
                broker.stop()

        broker.run(timeout=args.timeout, install_signal_handlers=False)
        emit("done", arrivals=list(zip(seqs, sent, arrived, strict=True)))
    broker.close()
