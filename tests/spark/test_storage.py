"""The Spark plugin's store (``sqlbroker.spark.storage``) on both backends, driven directly
(no SparkSession needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

import sqlbroker
from sqlbroker.core.errors import IdempotencyConflict, StorageError
from sqlbroker.features.publishing import PublishDefaults, build_message
from sqlbroker.spark.schema import arrow_schema
from sqlbroker.spark.storage import ExportRun, SparkRowFilter, SparkStore, open_store
from sqlbroker.spark.storage.columns import SPARK_COLUMNS, STREAM_COLUMNS

DEFAULTS = PublishDefaults(max_attempts=5, dedupe_window=3600.0, payload_limit=262144)


def _spark(broker: sqlbroker.Broker, url: str) -> SparkStore:
    return open_store(broker, url=url, options={})


def _stream_read(store: SparkStore, **where: Any) -> dict[str, list[Any]]:
    """A stream's snapshot read back by ``stream_batches``, column by column."""
    batches = list(store.stream_batches(**where))
    assert all(b.schema == arrow_schema(STREAM_COLUMNS) for b in batches)
    return pa.Table.from_batches(batches, schema=arrow_schema(STREAM_COLUMNS)).to_pydict()


def _messages(count: int, topic: str = "orders.created", same: bool = False) -> list[Any]:
    return [build_message(topic, {"n": 0 if same else n}, defaults=DEFAULTS) for n in range(count)]


def test_staged_winners_are_published_once_with_derived_keys(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    broker.subscribe("orders", "orders.#")
    store = _spark(broker, backend_url)
    # Partition 0 failed once (attempt 7) after staging two rows, then won (attempt 9).
    store.stage_insert(job="j1", partition=0, attempt=7, first_seq=0, rows=_messages(2))
    store.stage_insert(job="j1", partition=0, attempt=9, first_seq=0, rows=_messages(3))
    store.stage_insert(job="j1", partition=1, attempt=8, first_seq=0, rows=_messages(3, same=True))
    result = store.stage_publish(job="j1", winners=[(0, 9), (1, 8)], key_prefix="t:", chunk=2)
    assert (result.published, result.duplicates) == (6, 0)
    pending = broker.pending("orders", limit=100)
    assert len(pending) == 6
    assert store.stage_discard(job=None, older_than=broker.backend.now() + timedelta(1)) == 0

    # The same rows staged again by a re-run: all duplicates, nothing new.
    store.stage_insert(job="j2", partition=0, attempt=1, first_seq=0, rows=_messages(3))
    store.stage_insert(job="j2", partition=1, attempt=2, first_seq=0, rows=_messages(3, same=True))
    again = store.stage_publish(job="j2", winners=[(0, 1), (1, 2)], key_prefix="t:", chunk=2)
    assert (again.published, again.duplicates) == (0, 6)
    assert len(broker.pending("orders", limit=100)) == 6


def test_the_publish_commits_chunk_by_chunk_and_a_rerun_publishes_the_rest(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """Issue 28 item 5: each chunk of the driver's publish is a transaction of its own (on
    SQLite, the write lock is let go between chunks). A commit failing at its third chunk
    leaves the first two published; the job run again publishes exactly the rest."""
    broker.subscribe("orders", "orders.#")
    broker.publish("orders.created", {"taken": True}, idempotency_key="order-5")
    store = _spark(broker, backend_url)

    def rows(conflict: bool) -> list[Any]:
        messages = _messages(4) + _messages(2, same=True)
        fifth = build_message(
            "orders.created",
            {"n": 5 if conflict else "fixed"},
            defaults=DEFAULTS,
            idempotency_key="order-5" if conflict else "order-5b",
        )
        return [*messages[:4], fifth, *messages[4:]]

    store.stage_insert(job="j1", partition=0, attempt=1, first_seq=0, rows=rows(conflict=True))
    with pytest.raises(IdempotencyConflict):
        store.stage_publish(job="j1", winners=[(0, 1)], key_prefix="t:", chunk=2)
    assert len(broker.pending("orders", limit=100)) == 1 + 4
    assert store.stage_discard(job="j1", older_than=None) == 3

    store.stage_insert(job="j2", partition=0, attempt=1, first_seq=0, rows=rows(conflict=False))
    again = store.stage_publish(job="j2", winners=[(0, 1)], key_prefix="t:", chunk=2)
    assert (again.published, again.duplicates) == (3, 4)
    assert len(broker.pending("orders", limit=100)) == 1 + 7


def test_partitions_publish_on_parallel_connections_exactly_once(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """Issue 28 item 5: with ``connections=2`` PostgreSQL publishes the pages of different
    partitions in parallel transactions (SQLite, one writer, one after another): every row
    once, a re-run all duplicates; contents staged twice are still counted in partition
    order (one connection then); a conflict in one lane stops the publish with the broker's
    error."""
    broker.subscribe("orders", "orders.#")
    store = _spark(broker, backend_url)

    def rows(partition: int) -> list[Any]:
        return [
            build_message("orders.created", {"n": partition * 10 + n}, defaults=DEFAULTS)
            for n in range(5)
        ]

    for job in ("j1", "j2"):
        for partition in range(4):
            store.stage_insert(
                job=job, partition=partition, attempt=partition, first_seq=0, rows=rows(partition)
            )
    winners = [(p, p) for p in range(4)]
    first = store.stage_publish(job="j1", winners=winners, key_prefix="p:", chunk=2, connections=2)
    assert (first.published, first.duplicates) == (20, 0)
    claimed = broker.claim("orders", limit=100)
    expected = [p * 10 + n for p in range(4) for n in range(5)]
    assert sorted(d.payload["n"] for d in claimed) == expected
    again = store.stage_publish(job="j2", winners=winners, key_prefix="p:", chunk=2, connections=2)
    assert (again.published, again.duplicates) == (0, 20)

    for job in ("s1", "s2"):
        same = _messages(3, same=True)
        store.stage_insert(job=job, partition=0, attempt=1, first_seq=0, rows=same)
        store.stage_insert(job=job, partition=1, attempt=2, first_seq=0, rows=same[:2])
    pairs = [(0, 1), (1, 2)]
    result = store.stage_publish(job="s1", winners=pairs, key_prefix="s:", chunk=2, connections=2)
    assert (result.published, result.duplicates) == (5, 0)
    rerun = store.stage_publish(job="s2", winners=pairs, key_prefix="s:", chunk=2, connections=2)
    assert (rerun.published, rerun.duplicates) == (0, 5)

    broker.publish("orders.created", {"taken": True}, idempotency_key="taken")
    clash = build_message("orders.created", {"n": 1}, defaults=DEFAULTS, idempotency_key="taken")
    store.stage_insert(job="k", partition=0, attempt=1, first_seq=0, rows=rows(5))
    store.stage_insert(job="k", partition=1, attempt=2, first_seq=0, rows=[clash])
    with pytest.raises(IdempotencyConflict):
        store.stage_publish(job="k", winners=pairs, key_prefix="k:", chunk=2, connections=2)
    store.stage_discard(job="k", older_than=None)
    assert store.stage_discard(job=None, older_than=broker.backend.now() + timedelta(1)) == 0


def test_an_aborted_job_leaves_nothing(broker: sqlbroker.Broker, backend_url: str) -> None:
    store = _spark(broker, backend_url)
    store.stage_insert(job="j", partition=0, attempt=1, first_seq=0, rows=_messages(4))
    assert store.stage_discard(job="j", older_than=None) == 4
    assert store.stage_discard(job="j", older_than=None) == 0


def test_id_range_and_reads_follow_the_filter(broker: sqlbroker.Broker, backend_url: str) -> None:
    broker.subscribe("a", "a.#")
    broker.subscribe("b", "b.#")
    broker.publish_many(
        [{"topic": "a.x", "payload": n} for n in range(5)]
        + [{"topic": "b.y", "payload": n} for n in range(3)]
    )
    store = _spark(broker, backend_url)
    found = store.id_range(where=SparkRowFilter(table="messages", subscription="b"))
    assert found.count == 3
    batches = list(
        store.rows_read(
            where=SparkRowFilter(table="messages", subscription="b"),
            after_id=found.low - 1,
            upto_id=found.high,
            fetch=2,
        )
    )
    assert [batch.num_rows for batch in batches] == [2, 1]
    columns = pa.Table.from_batches(batches).to_pydict()
    assert list(columns) == list(SPARK_COLUMNS["messages"])
    assert columns["topic"] == ["b.y"] * 3
    assert all(isinstance(t, datetime) for t in columns["enqueued_at"])
    assert store.id_range(where=SparkRowFilter(table="archive")) is None


def test_stream_claims_are_read_back_and_acked(broker: sqlbroker.Broker, backend_url: str) -> None:
    broker.subscribe("s", "s.#")
    ids = broker.publish_many([{"topic": "s.x", "payload": n} for n in range(7)])
    store = _spark(broker, backend_url)
    assert store.stream_open(stream="st", subscription="s") == (0, 0)
    claim = {"stream": "st", "subscription": "s", "lease": 60.0, "worker": "w"}
    assert store.stream_claim(limit=4, **claim) == 1
    assert store.stream_claim(limit=4, **claim) == 2
    assert store.stream_claim(limit=4, **claim) == 2
    parts = [
        _stream_read(store, stream="st", after_seq=0, upto_seq=2, part=p, parts=2) for p in range(2)
    ]
    read = sorted(m for part in parts for m in part["message_id"])
    assert read == sorted(ids)
    assert store.stream_extend(stream="st", upto_seq=2, lease=120.0) == 7
    acked = store.stream_ack(stream="st", upto_seq=1)
    assert (acked.acked, acked.lost) == (4, 0)
    assert store.stream_open(stream="st", subscription="s") == (2, 1)
    assert len(broker.pending("s")) == 3
    assert store.stream_ack(stream="st", upto_seq=2).acked == 3
    assert broker.pending("s") == []


def test_a_streams_executor_read_yields_the_snapshot_as_arrow(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """``stream_batches`` (PostgreSQL: through ADBC) reads the messages as they were claimed,
    value for value what a batch read of them then reads (state running, the delivery id as
    ``id``), in the stream's Arrow schema; an empty partition yields no batch."""
    broker.subscribe("s", "s.#")
    broker.publish_many(
        [{"topic": "s.x", "payload": {"n": n}, "headers": {"h": str(n)}} for n in range(9)]
    )
    store = _spark(broker, backend_url)
    store.stream_open(stream="sa", subscription="s")
    claim = {"stream": "sa", "subscription": "s", "lease": 60.0, "worker": "w"}
    assert store.stream_claim(limit=5, **claim) == 1
    assert store.stream_claim(limit=5, **claim) == 2
    found = store.id_range(where=SparkRowFilter(table="messages"))
    batch = store.rows_read(
        where=SparkRowFilter(table="messages"),
        after_id=found.low - 1,
        upto_id=found.high,
        fetch=100,
    )
    claimed = pa.Table.from_batches(list(batch)).to_pylist()
    assert [row["state"] for row in claimed] == ["running"] * 9
    read = []
    for part in range(2):
        where = {"stream": "sa", "after_seq": 0, "upto_seq": 2, "part": part, "parts": 2}
        columns = _stream_read(store, **where)
        assert columns["id"]
        assert all(delivery % 2 == part for delivery in columns["id"])
        read += pa.Table.from_pydict(columns).to_pylist()
    assert sorted(read, key=lambda row: row["id"]) == claimed
    assert list(store.stream_batches(stream="sa", after_seq=2, upto_seq=3, part=0, parts=2)) == []


def test_stream_claims_keep_the_brokers_flow_limits_and_pauses(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    broker.subscribe("f", "f.#")
    broker.set_flow("f", max_running=2)
    broker.subscribe("p", "p.#")
    broker.pause("p")
    broker.publish_many([{"topic": t, "payload": n} for t in ("f.x", "p.x") for n in range(5)])
    store = _spark(broker, backend_url)
    claim = {"lease": 60.0, "worker": "w", "limit": 10}
    store.stream_open(stream="sf", subscription="f")
    store.stream_open(stream="sp", subscription="p")
    assert store.stream_claim(stream="sf", subscription="f", **claim) == 1
    assert store.stream_claim(stream="sf", subscription="f", **claim) == 1  # 2 running: full
    read = _stream_read(store, stream="sf", after_seq=0, upto_seq=1, part=0, parts=1)
    assert len(read["message_id"]) == 2
    assert store.stream_claim(stream="sp", subscription="p", **claim) == 0
    broker.resume("p")
    assert store.stream_claim(stream="sp", subscription="p", **claim) == 1
    read = _stream_read(store, stream="sp", after_seq=0, upto_seq=1, part=0, parts=1)
    assert len(read["message_id"]) == 5


def test_export_commit_deletes_exactly_or_nothing(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, backend_url: str
) -> None:
    broker = clocked_broker
    broker.subscribe("q", "q.#")
    broker.publish_many([{"topic": "q.x", "payload": n} for n in range(6)])
    broker.complete(broker.claim("q", limit=6))
    clock.advance(3600.0)
    store = _spark(broker, backend_url)
    cutoff = broker.backend.now() - timedelta(minutes=30)
    found = store.id_range(where=SparkRowFilter(table="archive", until=cutoff))
    wrong = ExportRun("r1", cutoff, found.high, 0, archive_rows=5, dead_rows=0)
    with pytest.raises(StorageError, match="nothing was deleted"):
        store.export_commit(run=wrong)
    assert len(broker.archive(limit=100)) == 6
    assert not store.export_done(run_id="r1")
    right = ExportRun("r2", cutoff, found.high, 0, archive_rows=6, dead_rows=0)
    store.export_commit(run=right)
    assert broker.archive(limit=100) == []
    assert store.export_done(run_id="r2")


def test_a_staged_publish_keeps_the_brokers_rules(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """Issue 28 item 5: on PostgreSQL the staged rows are published by SQL alone (no payload
    through the driver); the messages must be the broker's own: its payload hash (a later
    publish with the same key is a duplicate, with another payload a conflict), its message
    ids, ordering keys and routing (an unrouted row archived), a key repeated in one page
    with another payload refused."""
    broker.subscribe("orders", "orders.#")
    store = _spark(broker, backend_url)
    keyed = [
        build_message("orders.created", {"n": n}, defaults=DEFAULTS, idempotency_key=f"o-{n}")
        for n in range(3)
    ]
    ordered = [
        build_message("orders.paid", {"n": n}, defaults=DEFAULTS, key="customer-1")
        for n in range(3)
    ]
    repeat = build_message("orders.created", {"n": 0}, defaults=DEFAULTS, idempotency_key="o-0")
    stray = build_message("audit.created", {"n": 9}, defaults=DEFAULTS)
    store.stage_insert(
        job="j", partition=0, attempt=1, first_seq=0, rows=[*keyed, repeat, *ordered, stray]
    )
    result = store.stage_publish(job="j", winners=[(0, 1)], key_prefix="t:", chunk=100)
    assert (result.published, result.duplicates, result.unrouted) == (7, 1, 1)
    pending = broker.pending("orders", limit=100)
    assert len(pending) == 6
    assert {str(m.message_id)[14] for m in pending} == {"7"}  # UUID version 7
    assert sorted(m.state for m in pending if m.topic == "orders.paid") == [
        "available",
        "blocked",
        "blocked",
    ]
    again = broker.publish("orders.created", {"n": 1}, idempotency_key="o-1")
    assert again in {m.message_id for m in pending}
    with pytest.raises(IdempotencyConflict):
        broker.publish("orders.created", {"n": 5}, idempotency_key="o-2")

    clash = build_message("orders.created", {"n": 1}, defaults=DEFAULTS, idempotency_key="new")
    other = build_message("orders.created", {"n": 2}, defaults=DEFAULTS, idempotency_key="new")
    store.stage_insert(job="k", partition=0, attempt=1, first_seq=0, rows=[clash, other])
    with pytest.raises(IdempotencyConflict):
        store.stage_publish(job="k", winners=[(0, 1)], key_prefix="t:", chunk=100)
    assert len(broker.pending("orders", limit=100)) == 6


def _partition_exists(url: str, day: datetime) -> bool:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"sqlbroker_archive_p{day:%Y%m%d}",)
        ).fetchone()
    return bool(row and row[0])


def test_the_export_removes_whole_days_of_the_partitioned_archive(pg_url: str) -> None:
    """Issue 25 item 5: on PostgreSQL the export drops the archive's daily partitions that it
    exported whole instead of deleting their rows; a day holding a row that arrived after
    the export read it (past the id watermark) keeps that row, and goes with the next run."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    days = [today - timedelta(days=n) for n in (3, 2, 1)]

    def archive_at(at: datetime, count: int, *, maintain: bool = False) -> None:
        with sqlbroker.Broker(pg_url, clock=sqlbroker.ManualClock(at)) as broker:
            if maintain:
                broker.subscribe("q", "q.#")
                broker.backend.archive_partitions_maintain(ahead=4, keep=366 * 86400.0)
            broker.publish_many([{"topic": "q.x", "payload": n} for n in range(count)])
            broker.complete(broker.claim("q", limit=count))

    archive_at(days[0] + timedelta(hours=1), 3, maintain=True)
    archive_at(days[1] + timedelta(hours=1), 3)
    archive_at(days[2] + timedelta(hours=1), 3)
    with sqlbroker.Broker(pg_url) as broker:
        broker.subscribe("q", "q.#")
        broker.publish_many([{"topic": "q.x", "payload": n} for n in range(2)])
        broker.complete(broker.claim("q", limit=2))
        store = _spark(broker, pg_url)
        found = store.id_range(where=SparkRowFilter(table="archive", until=today))
        assert found is not None
        assert found.count == 9
        archive_at(days[1] + timedelta(hours=2), 1)  # late: past the watermark
        store.export_commit(run=ExportRun("r1", today, found.high, 0, 9, 0))
        assert [_partition_exists(pg_url, day) for day in days] == [False, True, True]
        assert len(broker.archive(limit=100)) == 1 + 2

        found = store.id_range(where=SparkRowFilter(table="archive", until=today))
        assert found is not None
        assert found.count == 1
        store.export_commit(run=ExportRun("r2", today, found.high, 0, 1, 0))
        assert [_partition_exists(pg_url, day) for day in [*days, today]] == [
            False,
            False,
            False,
            True,
        ]
        assert len(broker.archive(limit=100)) == 2


def _pattern_tests(plan: dict[str, Any]) -> int:
    """How many (row, pattern) pairs the routing join of a plan tested."""
    found = 0
    if "pattern" in plan.get("Join Filter", ""):
        tested = plan["Actual Rows"] + plan.get("Rows Removed by Join Filter", 0)
        found += tested * plan["Actual Loops"]
    for child in plan.get("Plans", []):
        found += _pattern_tests(child)
    return found


def test_a_staged_page_is_routed_once_per_topic(pg_url: str) -> None:
    """Issue 28 item 5: the routing of a page (the broker's message_insert_routing) tests
    each distinct topic against each pattern once, not every row: a page of 5,000 rows of
    one topic ran the pattern test (two regexes) 5,000 times, half of the statement."""
    import psycopg

    from sqlbroker.spark.storage.postgres import PostgresSparkStore

    with sqlbroker.Broker(pg_url, migrate=True) as broker:
        for name, pattern in (("orders", "orders.#"), ("paid", "*.paid"), ("all", "#")):
            broker.subscribe(name, pattern)
        store = _spark(broker, pg_url)
        assert isinstance(store, PostgresSparkStore)
        rows = [
            build_message(f"orders.{'paid' if n % 2 else 'created'}", {"n": n}, defaults=DEFAULTS)
            for n in range(300)
        ]
        store.stage_insert(job="j", partition=0, attempt=1, first_seq=0, rows=rows)
        sql = store._sql
        page = {
            **{"job_id": "j", "partition_id": 0, "attempt": 1, "after_seq": -1},
            **{"upto_seq": 299, "key_prefix": "t:", "now": None, "key_seqs": [], "keys": []},
        }
        with psycopg.connect(pg_url) as conn:
            conn.execute(sql["publish_settings"])
            reserved = conn.execute(sql["stage_page_reserve"], page).fetchone()
            assert reserved is not None
            assert len(reserved[1]) == 300
            insert = psycopg.ClientCursor(conn).mogrify(
                sql["stage_page_insert"],
                {
                    **page,
                    **{"seqs": reserved[1], "ids": reserved[2], "subscription": None},
                    **{"queue_regex": None, "channel": "c", "max_copies": 10**6},
                },
            )
            (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + insert).fetchone()[0]
            copies = conn.execute("SELECT count(*) FROM sqlbroker_message").fetchone()
            conn.rollback()
    assert copies == (300 + 150 + 300,)
    assert 0 < _pattern_tests(plan["Plan"]) <= 2 * 3
