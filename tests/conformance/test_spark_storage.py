"""The storage operations behind the Spark data source, on both backends (no Spark needed)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import sqlbroker
from sqlbroker.core.errors import StorageError
from sqlbroker.features.publishing import PublishDefaults, build_message
from sqlbroker.storage.spark_base import ExportRun, SparkRowFilter

DEFAULTS = PublishDefaults(max_attempts=5, dedupe_window=3600.0, payload_limit=262144)


def _spark(broker: sqlbroker.Broker) -> Any:
    return broker.backend


def _messages(count: int, topic: str = "orders.created", same: bool = False) -> list[Any]:
    return [build_message(topic, {"n": 0 if same else n}, defaults=DEFAULTS) for n in range(count)]


def test_staged_winners_are_published_once_with_derived_keys(broker: sqlbroker.Broker) -> None:
    broker.subscribe("orders", "orders.#")
    backend = _spark(broker)
    # Partition 0 failed once (attempt 7) after staging two rows, then won (attempt 9).
    backend.spark_stage_insert(job="j1", partition=0, attempt=7, first_seq=0, rows=_messages(2))
    backend.spark_stage_insert(job="j1", partition=0, attempt=9, first_seq=0, rows=_messages(3))
    backend.spark_stage_insert(
        job="j1", partition=1, attempt=8, first_seq=0, rows=_messages(2, same=True)
    )
    result = backend.spark_stage_publish(job="j1", winners=[(0, 9), (1, 8)], key_prefix="t:")
    assert (len(result.message_ids), result.duplicates) == (5, 0)
    pending = broker.pending("orders", limit=100)
    assert len(pending) == 5
    assert backend.spark_stage_discard(job=None, older_than=backend.now() + timedelta(1)) == 0

    # The same rows staged again by a re-run: all duplicates, nothing new.
    backend.spark_stage_insert(job="j2", partition=0, attempt=1, first_seq=0, rows=_messages(3))
    backend.spark_stage_insert(
        job="j2", partition=1, attempt=2, first_seq=0, rows=_messages(2, same=True)
    )
    again = backend.spark_stage_publish(job="j2", winners=[(0, 1), (1, 2)], key_prefix="t:")
    assert again.duplicates == 5
    assert len(broker.pending("orders", limit=100)) == 5


def test_an_aborted_job_leaves_nothing(broker: sqlbroker.Broker) -> None:
    backend = _spark(broker)
    backend.spark_stage_insert(job="j", partition=0, attempt=1, first_seq=0, rows=_messages(4))
    assert backend.spark_stage_discard(job="j", older_than=None) == 4
    assert backend.spark_stage_discard(job="j", older_than=None) == 0


def test_id_range_and_reads_follow_the_filter(broker: sqlbroker.Broker) -> None:
    broker.subscribe("a", "a.#")
    broker.subscribe("b", "b.#")
    broker.publish_many(
        [{"topic": "a.x", "payload": n} for n in range(5)]
        + [{"topic": "b.y", "payload": n} for n in range(3)]
    )
    backend = _spark(broker)
    found = backend.spark_id_range(where=SparkRowFilter(table="messages", subscription="b"))
    assert found.count == 3
    columns = backend.spark_rows_read(
        where=SparkRowFilter(table="messages", subscription="b"),
        after_id=found.low - 1,
        upto_id=found.high,
        limit=2,
    )
    assert len(columns["id"]) == 2
    assert columns["topic"] == ["b.y", "b.y"]
    assert all(isinstance(t, float) for t in columns["enqueued_at"])
    assert backend.spark_id_range(where=SparkRowFilter(table="archive")) is None


def test_stream_claims_are_read_back_and_acked(broker: sqlbroker.Broker) -> None:
    broker.subscribe("s", "s.#")
    ids = broker.publish_many([{"topic": "s.x", "payload": n} for n in range(7)])
    backend = _spark(broker)
    assert backend.spark_stream_open(stream="st", subscription="s") == (0, 0)
    claim = {"stream": "st", "subscription": "s", "lease": 60.0, "worker": "w"}
    assert backend.spark_stream_claim(limit=4, **claim) == 1
    assert backend.spark_stream_claim(limit=4, **claim) == 2
    assert backend.spark_stream_claim(limit=4, **claim) == 2
    parts = [
        backend.spark_stream_read(stream="st", after_seq=0, upto_seq=2, part=p, parts=2)
        for p in range(2)
    ]
    read = sorted(m for part in parts for m in part["message_id"])
    assert read == sorted(ids)
    assert backend.spark_stream_extend(stream="st", upto_seq=2, lease=120.0) == 7
    acked = backend.spark_stream_ack(stream="st", upto_seq=1)
    assert (acked.acked, acked.lost) == (4, 0)
    assert backend.spark_stream_open(stream="st", subscription="s") == (2, 1)
    assert len(broker.pending("s")) == 3
    assert backend.spark_stream_ack(stream="st", upto_seq=2).acked == 3
    assert broker.pending("s") == []


def test_export_commit_deletes_exactly_or_nothing(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    broker = clocked_broker
    broker.subscribe("q", "q.#")
    broker.publish_many([{"topic": "q.x", "payload": n} for n in range(6)])
    broker.complete(broker.claim("q", limit=6))
    clock.advance(3600.0)
    backend = _spark(broker)
    cutoff = backend.now() - timedelta(minutes=30)
    found = backend.spark_id_range(where=SparkRowFilter(table="archive", until=cutoff))
    wrong = ExportRun("r1", cutoff, found.high, 0, archive_rows=5, dead_rows=0)
    with pytest.raises(StorageError, match="nothing was deleted"):
        backend.archive_export_commit(run=wrong)
    assert len(broker.archive(limit=100)) == 6
    assert not backend.archive_export_done(run_id="r1")
    right = ExportRun("r2", cutoff, found.high, 0, archive_rows=6, dead_rows=0)
    backend.archive_export_commit(run=right)
    assert broker.archive(limit=100) == []
    assert backend.archive_export_done(run_id="r2")
