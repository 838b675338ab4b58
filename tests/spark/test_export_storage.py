"""The archive export's check against the database (``SparkStore.export_totals``) on both
backends, driven directly (no SparkSession needed)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import sqlbroker
from sqlbroker.core.errors import InvalidOption
from sqlbroker.spark.storage import ExportRun, ExportTotals, SparkRowFilter, open_store


def test_export_totals_count_per_topic_exactly_what_the_delete_removes(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, backend_url: str
) -> None:
    broker = clocked_broker
    broker.subscribe("q", "q.#")
    broker.publish_many(
        [{"topic": "q.a", "payload": n} for n in range(4)]
        + [{"topic": "q.b", "payload": n} for n in range(3)]
    )
    claimed = broker.claim("q", limit=7)
    broker.complete(claimed[:6])
    broker.dead_letter(claimed[6], reason="bad")
    clock.advance(3600.0)
    broker.publish("q.a", "late")  # after the cutoff: neither counted nor deleted
    broker.complete(broker.claim("q", limit=1))
    store = open_store(broker, url=broker.url, options={})
    cutoff = broker.backend.now() - timedelta(minutes=30)
    archived = store.id_range(where=SparkRowFilter(table="archive", until=cutoff))
    dead = store.id_range(where=SparkRowFilter(table="dead", until=cutoff))
    assert archived is not None
    assert dead is not None

    old = [r for r in broker.archive(limit=100) if r.finished_at < cutoff]
    expected = {}
    for topic in ("q.a", "q.b"):
        ids = sorted(r.id for r in old if r.topic == topic)
        expected[topic] = ExportTotals(rows=len(ids), id_sum=sum(ids), low=ids[0], high=ids[-1])
    totals = store.export_totals(table="archive", cutoff=cutoff, max_id=archived.high)
    assert totals == expected
    assert sum(t.rows for t in totals.values()) == archived.count == 6
    # Ids past the watermark are not the export's: a lower max_id counts fewer.
    fewer = store.export_totals(table="archive", cutoff=cutoff, max_id=archived.high - 1)
    assert sum(t.rows for t in fewer.values()) == 5
    (letter,) = store.export_totals(table="dead", cutoff=cutoff, max_id=dead.high).values()
    assert (letter.rows, letter.low, letter.high) == (1, dead.low, dead.high)
    with pytest.raises(InvalidOption, match="table"):
        store.export_totals(table="messages", cutoff=cutoff, max_id=archived.high)

    store.export_commit(run=ExportRun("r1", cutoff, archived.high, dead.high, 6, 1))
    assert store.export_totals(table="archive", cutoff=cutoff, max_id=archived.high) == {}
    assert store.export_totals(table="dead", cutoff=cutoff, max_id=dead.high) == {}
