"""Debounce and replace under concurrency on PostgreSQL (docs/flow-control.md, "Debounce
and replace"): publishers on their own connections publish one key at once, with and
without a worker claiming at the same moment. The key's lock serializes the publishers,
so they end with exactly one pending copy; a claim that wins the race is never replaced,
and nothing is lost: what is delivered is each thread's publishes in order, ending with
the last one committed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import sqlbroker
from sqlbroker import State

pytestmark = pytest.mark.postgres

THREADS = 4
PUBLISHES = 40


def _publish_concurrently(url: str, **options: Any) -> dict[str, tuple[int, int]]:
    """Every thread publishes (thread, n) for n in 0..PUBLISHES-1 to one key; returns the
    payload of each id returned."""
    start = threading.Barrier(THREADS)
    sent: dict[str, tuple[int, int]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(thread: int) -> None:
        try:
            with sqlbroker.Broker(url) as broker:
                start.wait()
                for n in range(PUBLISHES):
                    message_id = broker.send("sync", [thread, n], key="doc", **options)
                    with lock:
                        sent[message_id] = (thread, n)
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return sent


def test_concurrent_debounced_publishes_of_one_key_end_with_one_pending_copy(
    pg_url: str,
) -> None:
    with sqlbroker.Broker(pg_url, migrate=True) as broker:
        broker.send("sync", "warm-up", key="other")
        sent = _publish_concurrently(pg_url, debounce=3600)
        assert len(sent) == THREADS * PUBLISHES
        (pending,) = broker.pending("sync", state=State.SCHEDULED)
        assert pending.key == "doc"
        # The survivor is the publish committed last: some thread's last one.
        assert sent[pending.message_id][1] == PUBLISHES - 1
        assert [m.key for m in broker.pending("sync")] == ["other", "doc"]


def test_replacing_publishers_racing_a_worker_lose_nothing(pg_url: str) -> None:
    with sqlbroker.Broker(pg_url, migrate=True) as broker:
        broker.send("sync", "warm-up", key="other")
        broker.complete(broker.claim("sync", limit=1)[0])
        delivered: list[tuple[str, Any]] = []
        most_waiting = 0
        done = threading.Event()

        def work() -> None:
            nonlocal most_waiting
            with sqlbroker.Broker(pg_url) as worker:
                while True:
                    finished = done.is_set()
                    waiting = [m for m in worker.pending("sync") if m.state is not State.RUNNING]
                    most_waiting = max(most_waiting, len(waiting))
                    claimed = worker.claim("sync", limit=10)
                    for delivery in claimed:
                        delivered.append((delivery.message_id, delivery.payload))
                        worker.complete(delivery)
                    if not claimed:
                        # A publish racing the head's completion leaves its key headless
                        # until the reaper's key repair (as for any keyed publish).
                        worker.reap()
                    if finished and not worker.pending("sync"):
                        return

        claimer = threading.Thread(target=work)
        claimer.start()
        sent = _publish_concurrently(pg_url, replace=True)
        done.set()
        claimer.join()

    assert most_waiting <= 1
    ids = [message_id for message_id, _ in delivered]
    assert len(ids) == len(set(ids))
    assert all(tuple(payload) == sent[message_id] for message_id, payload in delivered)
    for thread in range(THREADS):
        mine = [n for t, n in (tuple(p) for _, p in delivered) if t == thread]
        assert mine == sorted(mine)
    # The last publish committed is never replaced, so it is delivered, last.
    assert tuple(delivered[-1][1])[1] == PUBLISHES - 1
    assert len(delivered) < len(sent)
