"""pgmq through its Python client (``pgmq.PGMQueue``, psycopg 3 and a pool), its schema
installed from the SQL the client package ships (no extension needed).

Used as its docs show for throughput: ``send`` / ``send_batch`` to publish (a batch is
measured both through the client and as its SQL function ``pgmq.send_batch(queue,
jsonb[])`` called on one connection with a prepared statement, each on a fresh queue; the
faster is pgmq's rate: issue 24 item 8), ``read`` with
``qty=n`` to claim a batch under a visibility timeout, ``delete_batch`` to ack (its fastest
ack: ``archive_batch`` would keep a copy, as sqlbroker's archive does). The latency
consumer long-polls with ``read_with_poll`` at a 10 ms poll interval (the default is 100).
"""

from __future__ import annotations

import argparse
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
    threaded_drain,
    timed_batches,
    timed_single,
)

NAME = "pgmq"
BACKENDS = ("postgresql",)
VISIBILITY = 30


def _client(url: str, connections: int = 4) -> Any:
    """A client on a pool opened with ``connections`` connections up front (so that no
    connection is opened while the clock runs)."""
    from pgmq import PGMQueue
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(url, min_size=connections, max_size=connections + 2, open=True)
    pool.wait()
    return PGMQueue(conn_string=url, init_extension=False, pool=pool)


def _close(queue: Any) -> None:
    queue.pool.close()


def _setup(database: Database) -> Any:
    from pgmq.install import install_pgmq_from_sql

    install_pgmq_from_sql(dsn=database.url)
    queue = _client(database.url)
    queue.create_queue(QUEUE)
    return queue


def _count(queue: Any) -> int:
    with queue.pool.connection() as conn:
        row = conn.execute(f"SELECT count(*) FROM pgmq.q_{QUEUE}").fetchone()
    return int(row[0])


def _prepublish(queue: Any, count: int) -> None:
    for start in range(0, count, 1000):
        queue.send_batch(QUEUE, [payload(start + i) for i in range(min(1000, count - start))])
    with queue.pool.connection() as conn:
        conn.execute(f"ANALYZE pgmq.q_{QUEUE}")


def publish_single(database: Database, sizes: Sizes) -> Sample:
    queue = _setup(database)
    try:
        sample = timed_single(lambda i: queue.send(QUEUE, payload(i)), sizes)
        check_published(_count(queue), sizes, sizes.publish_single)
    finally:
        _close(queue)
    return sample


SEND_BATCH = "SELECT * FROM pgmq.send_batch(%s::text, %s::jsonb[])"
_batch_runs = 0
"""Batch publishes run in this process: the two methods swap order each time."""


def _send_batch_client(queue: Any, database: Database, sizes: Sizes) -> float:
    sample = timed_batches(lambda seqs: queue.send_batch(QUEUE, [payload(i) for i in seqs]), sizes)
    return float(sample.metrics["rate"])


def _send_batch_sql(queue: Any, database: Database, sizes: Sizes) -> float:
    import psycopg
    from psycopg.types.json import Jsonb

    with psycopg.connect(database.url, autocommit=True) as conn:
        sample = timed_batches(
            lambda seqs: conn.execute(
                SEND_BATCH, (QUEUE, [Jsonb(payload(i)) for i in seqs]), prepare=True
            ).fetchall(),
            sizes,
        )
    return float(sample.metrics["rate"])


def publish_batch(database: Database, sizes: Sizes) -> Sample:
    """Both ways of calling ``send_batch``, each on a fresh queue; ``rate`` is the faster."""
    return _publish_batch(database, sizes, {"client": _send_batch_client, "sql": _send_batch_sql})


def _publish_batch(
    database: Database, sizes: Sizes, methods: dict[str, Callable[[Any, Database, Sizes], float]]
) -> Sample:
    global _batch_runs
    _batch_runs += 1
    order = list(methods) if _batch_runs % 2 else list(reversed(methods))
    queue = _setup(database)
    rates: dict[str, float] = {}
    try:
        for name in order:
            if rates:
                queue.drop_queue(QUEUE)
                queue.create_queue(QUEUE)
            rates[name] = methods[name](queue, database, sizes)
            sent = sizes.publish_batch // sizes.batch_size * sizes.batch_size
            check_published(_count(queue), sizes, sent)
    finally:
        _close(queue)
    best = max(rates, key=rates.__getitem__)
    return Sample(
        {"rate": rates[best]},
        {
            "messages": sent,
            "batch_size": sizes.batch_size,
            "method": best,
            **{f"{name}_rate": round(rate, 1) for name, rate in rates.items()},
        },
    )


def drain_claim(batch: int) -> Callable[[Database, Sizes], Sample]:
    def drain(database: Database, sizes: Sizes) -> Sample:
        queue = _setup(database)
        try:
            _prepublish(queue, sizes.drain)

            def loop(handled: list[Any]) -> None:
                while True:
                    messages = queue.read(QUEUE, vt=VISIBILITY, qty=batch)
                    if not messages:
                        return
                    ids = [m.msg_id for m in messages]
                    queue.delete_batch(QUEUE, ids)
                    handled += ids

            handled, elapsed = threaded_drain(sizes.drain_threads, loop)
            check_drained(handled, sizes.drain, _count(queue))
        finally:
            _close(queue)
        return Sample(
            {"rate": sizes.drain / elapsed},
            {
                "messages": sizes.drain,
                "seconds": round(elapsed, 3),
                "threads": sizes.drain_threads,
                "claim_limit": batch,
            },
        )

    return drain


def latency(database: Database, sizes: Sizes) -> Sample:
    queue = _setup(database)
    count = int(sizes.latency_rate * sizes.latency_seconds)
    try:
        queue.send(QUEUE, {"warmup": True})
        args = [NAME, "latency", "--url", database.url, "--expect", str(count)]
        with Consumer(*args, timeout=sizes.latency_seconds + 60) as consumer:
            consumer.read_event("ready")
            time.sleep(IDLE_SETTLE)
            paced = publish_paced(
                lambda i: queue.send(QUEUE, payload(i)),
                rate=sizes.latency_rate,
                seconds=sizes.latency_seconds,
            )
            done = consumer.finish()
    finally:
        _close(queue)
    return latency_sample(done["arrivals"], paced)


IMPLEMENTATIONS: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.single": publish_single,
    "publish.batch": publish_batch,
    # Each path alone (for profiling).
    "publish.batch.client": lambda d, s: _publish_batch(d, s, {"client": _send_batch_client}),
    "publish.batch.sql": lambda d, s: _publish_batch(d, s, {"sql": _send_batch_sql}),
    "drain.claim10": drain_claim(10),
    "drain.claim100": drain_claim(100),
    "latency": latency,
}
WORKLOADS = remote_workloads(NAME)


def consume(args: argparse.Namespace) -> None:
    queue = _client(args.url, connections=1)
    arrivals: list[tuple[int, float, float]] = []
    deadline = time.monotonic() + args.timeout
    while len(arrivals) < args.expect and time.monotonic() < deadline:
        messages = queue.read_with_poll(
            QUEUE, vt=VISIBILITY, qty=10, max_poll_seconds=1, poll_interval_ms=10
        )
        for message in messages:
            now = time.time()
            body = message.message
            if body.get("warmup"):
                emit("ready")
            else:
                arrivals.append((body["seq"], body["t"], now))
        if messages:
            queue.delete_batch(QUEUE, [m.msg_id for m in messages])
    _close(queue)
    emit("done", arrivals=arrivals)
