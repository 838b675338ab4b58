"""Idempotent publish under a real race: eight processes publish the same 2,000 keys at
once, in different orders and batches, and exactly 2,000 messages exist afterwards."""

from __future__ import annotations

import multiprocessing
import random

import pytest

import sqlbroker
from helpers import table_counts

KEYS = 2_000
PROCESSES = 8
BATCH = 100


def _publish_all(url: str, seed: int) -> dict[str, str]:
    """Publish every key once, shuffled and batched; return key -> message id."""
    order = list(range(KEYS))
    random.Random(seed).shuffle(order)
    seen: dict[str, str] = {}
    with sqlbroker.Broker(url) as broker:
        for start in range(0, KEYS, BATCH):
            chunk = order[start : start + BATCH]
            ids = broker.publish_many(
                [
                    {"topic": "orders.placed", "payload": {"order": n}, "idempotency_key": f"k{n}"}
                    for n in chunk
                ]
            )
            seen.update({f"k{n}": message_id for n, message_id in zip(chunk, ids, strict=True)})
    return seen


@pytest.mark.slow
def test_eight_processes_publishing_the_same_keys_make_each_message_once(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    broker.subscribe("orders", ["orders.#"])
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        results = pool.starmap(_publish_all, [(backend_url, seed) for seed in range(PROCESSES)])
    # Every process was told the same id for each key: the first publisher's.
    for key in results[0]:
        assert len({result[key] for result in results}) == 1, key
    counts = table_counts(broker.backend)
    assert counts["sqlbroker_message"] == KEYS
    assert counts["sqlbroker_dedupe"] == KEYS
    assert counts["sqlbroker_archive"] == 0
    assert {s.subscription: s.ready for s in broker.stats()}["orders"] == KEYS
