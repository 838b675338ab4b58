"""Concurrent consumers: threads sharing one broker and processes each with their own never
hold the same delivery at once, and every message is completed exactly once."""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import threading
from collections import Counter

import helpers
import sqlbroker
from helpers import table_counts

MESSAGES = 2_000
BATCH = 10


def _assert_completed_exactly_once(
    broker: sqlbroker.Broker, queue: str, message_ids: list[str]
) -> None:
    counts = table_counts(broker.backend)
    assert counts["sqlbroker_message"] == 0
    assert counts["sqlbroker_dead"] == 0
    assert counts["sqlbroker_archive"] == MESSAGES
    archived = broker.archive(queue, outcome="completed", limit=10_000)
    assert len(archived) == MESSAGES
    assert len({a.message_id for a in archived}) == MESSAGES
    assert {a.message_id for a in archived} == set(message_ids)
    assert {a.attempts for a in archived} == {1}


def test_threads_claim_each_message_exactly_once(broker: sqlbroker.Broker) -> None:
    message_ids: list[str] = []
    for start in range(0, MESSAGES, 1_000):
        message_ids += broker.send_many("work", list(range(start, start + 1_000)))
    seen: list[int] = []
    seen_lock = threading.Lock()
    errors: list[BaseException] = []
    start_line = threading.Barrier(8)

    def worker(index: int) -> None:
        try:
            start_line.wait(timeout=30)
            while True:
                deliveries = broker.claim("work", limit=BATCH, worker=f"thread-{index}")
                if not deliveries:
                    return
                with seen_lock:
                    seen.extend(d.id for d in deliveries)
                broker.complete(deliveries)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,), name=f"claimer-{i}") for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    duplicates = [item for item, count in Counter(seen).items() if count > 1]
    assert duplicates == [], "a delivery was handed to two claimers"
    assert len(seen) == MESSAGES
    _assert_completed_exactly_once(broker, "work", message_ids)


def test_processes_claim_each_message_exactly_once(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    message_ids: list[str] = []
    for start in range(0, MESSAGES, 1_000):
        message_ids += broker.send_many("work", list(range(start, start + 1_000)))
    context = multiprocessing.get_context("spawn")
    workers = 4
    barrier = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(
            target=helpers.process_claim_worker,
            args=(backend_url, "work", BATCH, barrier, results, index),
            name=f"claimer-{index}",
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    reports = []
    try:
        for _ in processes:
            reports.append(results.get(timeout=120))
    except queue_module.Empty:
        raise AssertionError(f"only {len(reports)} of {workers} workers reported") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
        results.join_thread()
    errors = [(index, error) for index, _, error in reports if error]
    assert errors == []
    assert [process.exitcode for process in processes] == [0] * workers
    seen = [delivery_id for _, claimed, _ in reports for delivery_id, _ in claimed]
    duplicates = [item for item, count in Counter(seen).items() if count > 1]
    assert duplicates == [], "a delivery was handed to two processes"
    assert len(seen) == MESSAGES
    assert {message_id for _, claimed, _ in reports for _, message_id in claimed} == set(
        message_ids
    )
    _assert_completed_exactly_once(broker, "work", message_ids)
