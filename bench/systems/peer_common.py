"""What the peers' modules share: their workloads run inside ``bench/.peers-venv`` (see
``bench/peers.py``), so nothing here may import sqlbroker."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import peers
from harness import BenchError, Sample, Sizes, percentile

PEER_WORKLOADS = ("publish.single", "publish.batch", "drain.claim10", "drain.claim100", "latency")


def remote_workloads(
    system: str, names: tuple[str, ...] = PEER_WORKLOADS
) -> dict[str, Callable[..., Sample]]:
    return {name: peers.remote(system, name) for name in names}


def encode(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def timed_single(send: Callable[[int], object], sizes: Sizes) -> Sample:
    """``send(i)`` for the warm-up and then ``sizes.publish_single`` messages, timed."""
    for i in range(sizes.warmup):
        send(i)
    timings: list[float] = []
    started = time.perf_counter()
    for i in range(sizes.publish_single):
        before = time.perf_counter()
        send(i)
        timings.append(time.perf_counter() - before)
    elapsed = time.perf_counter() - started
    return _single_sample(sizes, elapsed, timings)


def _single_sample(sizes: Sizes, elapsed: float, timings: list[float]) -> Sample:
    return Sample(
        {"rate": sizes.publish_single / elapsed},
        {
            "messages": sizes.publish_single,
            "seconds": round(elapsed, 3),
            "send_p50_ms": round(percentile(timings, 0.5) * 1000, 3),
            "send_p99_ms": round(percentile(timings, 0.99) * 1000, 3),
        },
    )


async def timed_single_async(send: Callable[[int], Awaitable[object]], sizes: Sizes) -> Sample:
    """``await send(i)`` one after the other, as :func:`timed_single` (one event loop)."""
    for i in range(sizes.warmup):
        await send(i)
    timings: list[float] = []
    started = time.perf_counter()
    for i in range(sizes.publish_single):
        before = time.perf_counter()
        await send(i)
        timings.append(time.perf_counter() - before)
    elapsed = time.perf_counter() - started
    return _single_sample(sizes, elapsed, timings)


def timed_batches(send_batch: Callable[[list[int]], object], sizes: Sizes) -> Sample:
    """``send_batch(seqs)`` for the warm-up and then ``publish_batch`` messages in batches of
    ``batch_size``, timed."""
    send_batch(list(range(sizes.warmup)))
    batches = sizes.publish_batch // sizes.batch_size
    started = time.perf_counter()
    for b in range(batches):
        base = b * sizes.batch_size
        send_batch(list(range(base, base + sizes.batch_size)))
    elapsed = time.perf_counter() - started
    sent = batches * sizes.batch_size
    return Sample(
        {"rate": sent / elapsed},
        {"messages": sent, "batch_size": sizes.batch_size, "seconds": round(elapsed, 3)},
    )


def check_published(found: int, sizes: Sizes, sent: int) -> None:
    if found != sizes.warmup + sent:
        raise BenchError(f"{found} jobs in the queue after publishing {sizes.warmup + sent}")


def check_drained(handled: list[Any], expected: int, left: int) -> None:
    """Exactly ``expected`` distinct jobs handled, none twice, none left in the queue."""
    if len(handled) != len(set(handled)):
        raise BenchError(f"{len(handled) - len(set(handled))} jobs handled twice")
    if len(handled) != expected:
        raise BenchError(f"handled {len(handled)} of {expected} jobs")
    if left:
        raise BenchError(f"{left} jobs still in the queue")


def threaded_drain(threads: int, loop: Callable[[list[Any]], None]) -> tuple[list[Any], float]:
    """Run ``loop(handled)`` in ``threads`` threads started together; each appends the ids it
    handled. Returns all ids and the wall time."""
    gate = threading.Barrier(threads + 1)
    results: list[list[Any]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def body(mine: list[Any]) -> None:
        try:
            gate.wait()
            loop(mine)
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=body, args=(r,)) for r in results]
    for worker in workers:
        worker.start()
    gate.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise BenchError(f"a consumer thread failed: {errors[0]!r}")
    return [i for r in results for i in r], elapsed
