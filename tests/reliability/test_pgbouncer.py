"""sqlbroker behind PgBouncer in transaction-pooling mode (issue 25, part 4).

A PgBouncer of the test's own (``reliability/pgbouncer.py``) sits between sqlbroker and the
test PostgreSQL with a smaller server pool than sqlbroker's client pool, so consecutive
transactions of one client land on different server sessions. ``pooler="transaction"``
sends no session settings and prepares nothing on the server; LISTEN goes to the server
directly through ``listen_url`` (or is left out, and the poll alone finds messages).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import ANY

import psycopg
import pytest

import sqlbroker
from reliability import pgbouncer
from reliability.checker import verdict_for
from reliability.history import read_histories
from reliability.pgfaults import (
    agents,
    consumer,
    describe,
    pickup_latencies,
    producer,
    wait_all,
    wait_drained,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not pgbouncer.available(),
        reason="PgBouncer is not installed (apt-get install pgbouncer; `make test` installs it)",
    ),
]


@pytest.fixture
def bouncer(pg_url: str) -> Iterator[pgbouncer.PgBouncer]:
    # Two server connections for sqlbroker's pool of six: sessions are shared for sure.
    pooler = pgbouncer.PgBouncer(pg_url, pool_mode="transaction", pool_size=2).start()
    yield pooler
    pooler.stop()


def _server_sessions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_without_the_pooler_option_the_connection_is_refused_with_a_hint(
    bouncer: pgbouncer.PgBouncer, pg_url: str
) -> None:
    """sqlbroker's session settings travel as startup ``options``, which PgBouncer
    refuses: a ConfigurationError naming the option to set, not a retryable loss."""
    with (
        sqlbroker.Broker(bouncer.url_for(pg_url)) as broker,
        pytest.raises(sqlbroker.ConfigurationError, match="pooler='transaction'"),
    ):
        broker.send("jobs", {"n": 0})


def test_transaction_pooler_options_are_checked(pg_url: str) -> None:
    with pytest.raises(sqlbroker.InvalidOption, match="pooler"):
        sqlbroker.Broker(pg_url, pooler="statement")
    with pytest.raises(sqlbroker.InvalidOption, match="synchronous_commit"):
        sqlbroker.Broker(pg_url, pooler="transaction", synchronous_commit="off")
    with pytest.raises(sqlbroker.InvalidOption, match="options="):
        sqlbroker.Broker(f"{pg_url}?options=-c%20work_mem%3D8MB", pooler="transaction")
    with pytest.raises(sqlbroker.InvalidOption, match="listen_url"):
        sqlbroker.Broker(pg_url, listen_url="sqlite:///x.db")


def test_a_first_publish_in_a_caller_s_transaction_needs_no_second_server_session(
    pg_url: str,
) -> None:
    """The check that a caller's connection reaches the broker's database reads the
    broker's side first: read while the caller's transaction held the pooler's only
    server session, it waited for a second one until the network timeout (two producers
    behind a pool of two did so in CI)."""
    pooler = pgbouncer.PgBouncer(pg_url, pool_mode="transaction", pool_size=1).start()
    try:
        url = pooler.url_for(pg_url)
        with sqlbroker.Broker(url, pooler="transaction", network_timeout=3) as broker:
            broker.subscribe("orders", ["orders"])
        with sqlbroker.Broker(url, pooler="transaction", network_timeout=3) as broker:
            with psycopg.connect(url, prepare_threshold=None) as conn:
                sent = broker.send("orders", {"n": 1}, conn=conn)
            [pending] = broker.pending("orders")
            assert pending.message_id == sent
    finally:
        pooler.stop()


def test_publish_claim_settle_schedules_sagas_and_results_through_pgbouncer(
    bouncer: pgbouncer.PgBouncer, pg_url: str
) -> None:
    """Every statement many times over (psycopg would prepare each from its fifth run,
    and the next transaction on another server session would not find it), on server
    sessions shared by all of sqlbroker's connections."""
    url = bouncer.url_for(pg_url)
    with sqlbroker.Broker(url, pooler="transaction", listen_url=pg_url, pool_size=6) as broker:
        for n in range(30):
            broker.send("jobs", {"n": n}, key=f"k{n % 3}", idempotency_key=f"i{n}")
        broker.publish_many([{"topic": "jobs", "payload": {"n": 30 + n}} for n in range(10)])
        seen: list[int] = []
        retried = False
        while found := broker.claim("jobs", limit=4, lease=30):
            for delivery in found:
                if delivery.payload["n"] == 5 and not retried:
                    broker.retry(delivery, after=0, error="once more")
                    retried = True
                    continue
                seen.append(delivery.payload["n"])
                broker.complete(delivery)
        assert sorted(seen) == list(range(40))
        for n in range(30):  # the same keys again: found, not published twice
            broker.send("jobs", {"n": n}, key=f"k{n % 3}", idempotency_key=f"i{n}")
        assert broker.claim("jobs", limit=50, lease=30) == []

        broker.subscribe("ticker", ["ticks"])
        broker.schedule("tick", "ticks", {"t": 1}, every=1)  # the first tick in 1 s
        time.sleep(1.2)
        assert broker.run_due_schedules().published == {"tick": [ANY]}
        (tick,) = broker.claim("ticker", lease=30)
        broker.complete(tick)

        flow = sqlbroker.Saga(
            "flow",
            [sqlbroker.Step("one", compensate=False), sqlbroker.Step("two", compensate=False)],
        )

        @broker.saga_step(flow, "one")
        def one(ctx: sqlbroker.StepContext) -> dict[str, int]:
            return {"one": ctx.data["x"] + 1}

        @broker.saga_step(flow, "two")
        def two(ctx: sqlbroker.StepContext) -> dict[str, int]:
            return {"two": ctx.outputs["one"]["one"] * 2}

        @broker.subscriber(queue="answers")
        def answer(msg: sqlbroker.Message) -> int:
            return int(msg.payload["q"]) * 7

        @broker.subscriber(queue="effects")
        def effect(msg: sqlbroker.Message) -> None:
            with msg.transaction() as conn:  # the handler's effects and the ack, one commit
                conn.execute("CREATE TABLE IF NOT EXISTS effect (n int PRIMARY KEY)")
                conn.execute("INSERT INTO effect VALUES (%s)", (msg.payload["n"],))

        saga_id = broker.sagas.start(flow, {"x": 1})
        asked = broker.send("answers", {"q": 6})
        for n in range(12):
            broker.send("effects", {"n": n})
        broker.run_until_idle(timeout=60)
        with psycopg.connect(pg_url) as direct:
            assert direct.execute("SELECT count(*) FROM effect").fetchone() == (12,)
        assert broker.sagas.get(saga_id).status == "completed"
        assert broker.result(asked, wait=10).value == 42
        # sqlbroker's six connections shared two server sessions (plus the direct LISTEN
        # sessions of the result hub and the worker, which were direct).
        assert _server_sessions(pg_url) <= 2 + 2


@pytest.mark.slow
def test_workers_and_producers_through_pgbouncer_lose_nothing_and_are_woken(
    bouncer: pgbouncer.PgBouncer, pg_url: str, tmp_path: Path
) -> None:
    """Two producers and two worker processes, all through PgBouncer in transaction mode,
    each pair on a queue of its own: one worker LISTENs directly (``listen_url``), the
    other has no LISTEN session (none can work through the pooler) and polls."""
    url = bouncer.url_for(pg_url)
    poll = 1.0
    through = {"pooler": "transaction", "lease": 5, "sleep": 0.01, "poll_interval": poll}
    with agents() as started:
        woken = consumer(url, tmp_path, "woken", queue="jobs", listen_url=pg_url, **through)
        polling = consumer(url, tmp_path, "polling", queue="polled", **through)
        started += [woken, polling]
        for agent in started:
            agent.wait_ready()
        producers = [
            producer(
                url,
                tmp_path,
                name,
                queue=queue,
                count=300,
                rate=60,
                burst=10,
                tx_every=7,
                rollback_every=11,
                pooler="transaction",
            )
            for name, queue in (("p-jobs", "jobs"), ("p-polled", "polled"))
        ]
        started += producers
        wait_all(producers, timeout=120)
        wait_drained(pg_url, timeout=60)
        for agent in (woken, polling):
            assert agent.alive, agent.log()
            assert agent.stop() == 0, agent.log()
    events = read_histories(tmp_path)
    for event in events:  # each producer's messages go to its own queue
        if event["op"] == "publish":
            event["subs"] = [event["proc"].removeprefix("p-")]
    verdict = verdict_for(events, pg_url, subscriptions=["jobs", "polled"], lease=5)
    pickups = {
        name: pickup_latencies([e for e in events if e["proc"] in (name, f"p-{queue}")])
        for name, queue in (("woken", "jobs"), ("polling", "polled"))
    }
    print(
        f"\n{verdict.summary()}\npickup by the LISTENing worker:"
        f" {describe(pickups['woken'].values())}\npickup by the polling worker:"
        f" {describe(pickups['polling'].values())}"
    )
    verdict.assert_clean()
    assert pickups["woken"]
    assert pickups["polling"]
    # Woken by notifications: no pickup waits for a poll; the poll alone finds every
    # message within its interval (plus slack for a loaded two-core machine).
    assert max(pickups["woken"].values()) < poll / 2
    assert max(pickups["polling"].values()) < 3 * poll
