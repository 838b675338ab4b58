"""Per-key order (DESIGN §2.5): messages with the same ordering key in one subscription
complete in publish order, at most one in flight per key; a failing head blocks its key
until it succeeds or is dead-lettered."""

from __future__ import annotations

import sqlbroker
from helpers import claim_one


def test_ordering_key_allows_one_in_flight_per_key(broker: sqlbroker.Broker) -> None:
    """DESIGN §2.5: same key, one subscription → publish order, at most one in flight."""
    first = broker.send("q", "k1-first", key="k1")
    second = broker.send("q", "k1-second", key="k1")
    other = broker.send("q", "k2", key="k2")
    claimed = broker.claim("q", limit=10)
    assert sorted(d.message_id for d in claimed) == sorted([first, other])
    assert broker.claim("q", limit=10) == []
    broker.complete([d for d in claimed if d.message_id == first])
    assert [d.message_id for d in broker.claim("q", limit=10)] == [second]


def test_ordering_key_head_retrying_blocks_its_key(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    first = clocked_broker.send("q", 1, key="k")
    second = clocked_broker.send("q", 2, key="k")
    head = claim_one(clocked_broker, "q")
    assert head.message_id == first
    clocked_broker.retry(head, after=10)
    clock.advance(5)
    assert clocked_broker.claim("q", limit=10) == [], (
        "the key's head is backing off: nothing else may run"
    )
    clock.advance(5)
    again = claim_one(clocked_broker, "q")
    assert again.message_id == first
    clocked_broker.complete(again)
    assert claim_one(clocked_broker, "q").message_id == second


def test_ordering_key_moves_on_when_the_head_is_dead_lettered(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1, key="k")
    second = broker.send("q", 2, key="k")
    head = claim_one(broker, "q")
    broker.dead_letter(head, reason="poison")
    assert claim_one(broker, "q").message_id == second


def test_ordering_keys_are_per_subscription(broker: sqlbroker.Broker) -> None:
    broker.subscribe("a", "t")
    broker.subscribe("b", "t")
    broker.publish("t", 1, key="k")
    broker.publish("t", 2, key="k")
    assert [d.payload for d in broker.claim("a", limit=10)] == [1]
    assert [d.payload for d in broker.claim("b", limit=10)] == [1]


def test_a_batch_with_one_key_is_claimed_one_by_one_in_publish_order(
    broker: sqlbroker.Broker,
) -> None:
    ids = broker.send_many("q", [1, 2, 3], key="k")
    seen = []
    for _ in ids:
        (delivery,) = broker.claim("q", limit=10)
        seen.append(delivery.message_id)
        broker.complete(delivery)
    assert seen == ids
    assert broker.claim("q", limit=10) == []


def test_fan_out_keeps_one_line_per_subscription(broker: sqlbroker.Broker) -> None:
    broker.subscribe("a", ["orders.#"])
    broker.subscribe("b", ["orders.*"])
    first = broker.publish("orders.x", 1, key="k")
    broker.publish("orders.x", 2, key="k")
    heads = {name: broker.claim(name, limit=10) for name in ("a", "b")}
    assert {name: [d.message_id for d in got] for name, got in heads.items()} == {
        "a": [first],
        "b": [first],
    }


def test_an_expired_head_lets_its_key_move_on(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.send("q", "stale", key="k", ttl=5)
    fresh = clocked_broker.send("q", "fresh", key="k")
    clock.advance(6)
    assert clocked_broker.reap()["expired"] == 1
    assert [d.message_id for d in clocked_broker.claim("q", limit=10)] == [fresh]


def test_a_cancelled_head_lets_its_key_move_on(broker: sqlbroker.Broker) -> None:
    head = broker.send("q", 1, key="k")
    nxt = broker.send("q", 2, key="k")
    assert broker.cancel(head) == 1
    assert [d.message_id for d in broker.claim("q", limit=10)] == [nxt]


def test_a_replayed_dead_letter_queues_behind_its_key(broker: sqlbroker.Broker) -> None:
    first = broker.send("q", 1, key="k")
    broker.dead_letter(claim_one(broker, "q"), reason="bad")
    second = broker.send("q", 2, key="k")
    broker.dead_letters.replay(all=True)
    (delivery,) = broker.claim("q", limit=10)
    assert delivery.message_id == second
    broker.complete(delivery)
    (replayed,) = broker.claim("q", limit=10)
    assert replayed.message_id == first
    assert replayed.replay_count == 1


def test_keys_are_independent_and_unkeyed_messages_flow(broker: sqlbroker.Broker) -> None:
    a1 = broker.send("q", "a1", key="a")
    broker.send("q", "a2", key="a")
    b1 = broker.send("q", "b1", key="b")
    free = broker.send("q", "free")
    assert sorted(d.message_id for d in broker.claim("q", limit=10)) == sorted([a1, b1, free])
    stats = {s.subscription: s for s in broker.stats()}["q"]
    assert (stats.running, stats.blocked) == (3, 1)


MINE = "6d696e65-0000-4000-8000-000000000000"


def test_the_reaper_gives_a_headless_key_its_next_copy_once(broker: sqlbroker.Broker) -> None:
    """A crash between a head's removal and its key's promotion leaves the key with blocked
    copies and no head; the reaper's repair promotes the oldest, once, and leaves a key
    that has a head alone."""
    lost = [broker.send("q", n, key="lost") for n in range(5)]
    kept = [broker.send("q", n, key="kept") for n in range(3)]
    heads = broker.claim("q", limit=10)
    assert sorted(d.message_id for d in heads) == sorted([lost[0], kept[0]])
    gone = next(d for d in heads if d.key == "lost")
    mark = "?" if broker.backend_name == "sqlite" else "%s"
    with broker.backend.begin() as conn_tx:  # the head leaves; the promotion never runs
        conn = conn_tx.connection
        conn.execute(f"DELETE FROM sqlbroker_message WHERE id = {mark}", (gone.id,))
    assert broker.claim("q", limit=10) == []
    assert broker.reap()["unblocked"] == 1
    assert broker.reap()["unblocked"] == 0
    assert [d.message_id for d in broker.claim("q", limit=10)] == [lost[1]]


def test_key_repair_never_reopens_a_head_claimed_meanwhile(pg_url: str) -> None:
    """PostgreSQL, two statements racing: the reaper's key repair picks a headless key's
    next copy from its snapshot while another transaction promotes and claims it. The
    repair must leave it alone: it used to set the running copy back to ``available``, so a
    second consumer claimed it while the first still held a valid lease (found by the
    per-key kill loop in tests/reliability). It skips a copy another transaction holds,
    without waiting for it: a worker's promotion and the repair waiting for each other's
    rows were a deadlock, which made the worker retry a complete that had committed and
    report its lease lost (the same kill loop)."""
    import psycopg

    with sqlbroker.Broker(pg_url) as broker:
        broker.send("q", 1, key="k")
        second = broker.send("q", 2, key="k")
        head = claim_one(broker, "q")
        with psycopg.connect(pg_url, autocommit=True) as admin:
            # The head leaves without its promotion: the key is headless, as after a crash.
            admin.execute("DELETE FROM sqlbroker_message WHERE id = %s", (head.id,))
            claimer = psycopg.connect(pg_url)
            try:
                claimer.execute(
                    "SELECT id FROM sqlbroker_message WHERE message_id = %s FOR UPDATE",
                    (second,),
                )
                # Held by the claimer: skipped at once (it waited, until lock_timeout).
                repaired = broker.backend.key_repair(limit=100)
                claimer.execute(
                    "UPDATE sqlbroker_message SET state = 'running', lease_token = %s,"
                    " lease_expires_at = now() + interval '1 minute', attempts = attempts + 1"
                    " WHERE message_id = %s",
                    (MINE, second),
                )
                claimer.commit()
                # Committed since: the repair reads the copy's new state and leaves it.
                assert broker.backend.key_repair(limit=100) == 0
            finally:
                claimer.close()
            row = admin.execute(
                "SELECT state, lease_token::text FROM sqlbroker_message WHERE message_id = %s",
                (second,),
            ).fetchone()
        assert repaired == 0
        assert row == ("running", MINE)
        assert broker.claim("q") == []
