"""Exactly-once effects in the broker's database: ``msg.transaction()`` commits a handler's
writes and its message's ack together (DESIGN §2.7), on both backends, for plain-function
and coroutine handlers; and the low-level ``complete(conn=)`` does the same for a caller."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from runtime.support import WorkerProcess, assert_all_completed_once, run_until_idle

Spawn = Callable[..., WorkerProcess]
TABLE = "CREATE TABLE app_effects (message_id text, attempt integer, pid integer)"


def _app(backend_url: str) -> Any:
    if backend_url.startswith("sqlite"):
        return sqlite3.connect(backend_url.removeprefix("sqlite:///"), isolation_level=None)
    import psycopg

    return psycopg.connect(backend_url, autocommit=True)


def _placeholder(backend_url: str) -> str:
    return "?" if backend_url.startswith("sqlite") else "%s"


@pytest.fixture
def app_table(broker: sqlbroker.Broker, backend_url: str) -> Callable[[], list[tuple[Any, ...]]]:
    broker.stats()  # the schema first: SQLite creates it on first use
    with _closing(_app(backend_url)) as conn:
        conn.execute(TABLE)

    def rows() -> list[tuple[Any, ...]]:
        with _closing(_app(backend_url)) as conn:
            return [tuple(r) for r in conn.execute("SELECT message_id, attempt FROM app_effects")]

    return rows


class _closing:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __enter__(self) -> Any:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


async def _execute(conn: Any, statement: str, params: tuple[Any, ...]) -> None:
    result = conn.execute(statement, params)
    if asyncio.iscoroutine(result):
        await result


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_effect_and_the_ack_commit_together(
    broker: sqlbroker.Broker, backend_url: str, app_table: Any, kind: str
) -> None:
    """Attempt 1 writes its row and then fails inside the block: the row is rolled back
    with the (absent) ack, and attempt 2's row is the only one left."""
    insert = f"INSERT INTO app_effects VALUES ({', '.join([_placeholder(backend_url)] * 3)})"
    retry = sqlbroker.RetryPolicy(base=0.01, cap=0.01)

    if kind == "sync":

        @broker.subscriber(queue="jobs", retry=retry)
        def handle(msg: sqlbroker.Message) -> None:
            with msg.transaction() as conn:
                conn.execute(insert, (msg.id, msg.attempt, os.getpid()))
                if msg.attempt == 1 and msg.payload == "flaky":
                    raise RuntimeError("after the write, before the commit")

    else:

        @broker.subscriber(queue="jobs", retry=retry)
        async def handle_async(msg: sqlbroker.Message) -> None:
            async with msg.transaction() as conn:
                await _execute(conn, insert, (msg.id, msg.attempt, os.getpid()))
                if msg.attempt == 1 and msg.payload == "flaky":
                    raise RuntimeError("after the write, before the commit")

    ids = {broker.send("jobs", payload): payload for payload in ["steady", "flaky", "steady2"]}
    run_until_idle(broker)
    rows = app_table()
    assert sorted(rows) == sorted(
        (message_id, 2 if payload == "flaky" else 1) for message_id, payload in ids.items()
    )
    assert_all_completed_once(broker, "jobs", ids)


def test_an_exception_after_the_commit_does_not_retry(
    broker: sqlbroker.Broker, backend_url: str, app_table: Any
) -> None:
    insert = f"INSERT INTO app_effects VALUES ({', '.join([_placeholder(backend_url)] * 3)})"
    calls: list[int] = []

    @broker.subscriber(queue="jobs")
    def handle(msg: sqlbroker.Message) -> None:
        calls.append(msg.attempt)
        with msg.transaction() as conn:
            conn.execute(insert, (msg.id, msg.attempt, 0))
        raise RuntimeError("too late: the message is already completed")

    message_id = broker.send("jobs", 1)
    run_until_idle(broker)
    assert calls == [1]
    assert app_table() == [(message_id, 1)]
    assert [row.message_id for row in broker.archive()] == [message_id]


def test_a_transaction_is_entered_once_and_settles_the_message(
    broker: sqlbroker.Broker, app_table: Any
) -> None:
    outcomes: list[str] = []

    @broker.subscriber(queue="jobs", ack="manual")
    def handle(msg: sqlbroker.Message) -> None:
        transaction = msg.transaction()
        with transaction:
            pass
        for attempt in (lambda: transaction.__enter__(), msg.ack):
            try:
                attempt()
            except sqlbroker.SqlbrokerError as error:
                outcomes.append(type(error).__name__)

    broker.send("jobs", 1)
    run_until_idle(broker)
    assert outcomes == ["SqlbrokerError", "AlreadySettled"]
    assert broker.pending("jobs") == []


def test_complete_with_conn_joins_the_callers_transaction(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock, backend_url: str
) -> None:
    """The low-level consumer's way: claim, write, ``complete(conn=)``, commit. A lease
    lost meanwhile raises ``LeaseLost`` so that the caller rolls back its write."""
    broker = clocked_broker
    broker.stats()
    with _closing(_app(backend_url)) as conn:
        conn.execute(TABLE)
    first, second = broker.send("jobs", 1), broker.send("jobs", 2)
    one, two = broker.claim("jobs", limit=2, lease=10)
    app = _app(backend_url)
    insert = f"INSERT INTO app_effects VALUES ({', '.join([_placeholder(backend_url)] * 3)})"
    try:
        app.execute("BEGIN")
        app.execute(insert, (one.message_id, 1, 0))
        broker.complete(one, conn=app)
        app.execute("COMMIT")

        clock.advance(11)
        broker.reap()
        (again,) = broker.claim("jobs", lease=10)
        assert again.message_id == second
        app.execute("BEGIN")
        app.execute(insert, (two.message_id, 1, 0))
        with pytest.raises(sqlbroker.LeaseLost):
            broker.complete(two, conn=app)
        app.execute("ROLLBACK")
    finally:
        app.close()
    with _closing(_app(backend_url)) as conn:
        assert [r[0] for r in conn.execute("SELECT message_id FROM app_effects")] == [first]
    assert [row.message_id for row in broker.archive()] == [first]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_effects_are_exactly_once_with_workers_killed_in_a_loop(
    broker: sqlbroker.Broker,
    backend_url: str,
    app_table: Any,
    spawn_worker: Spawn,
    effects: Path,
    kind: str,
) -> None:
    """Workers are SIGKILLed at random moments (many of them inside a handler's open
    transaction) and replaced. In the end the effects table holds each message exactly
    once, each from an attempt that also completed the message."""
    total = 150
    ids = {broker.send("jobs", {"id": f"m{n}", "sleep": 0.02}): f"m{n}" for n in range(total)}
    options = {
        "handler": kind,
        "effects_table": 1,
        "lease": 1.0,
        "reap_interval": 0.2,
        "concurrency": 4,
        "prefetch": 0,
        "max_attempts": 100,
        "retry_base": 0.01,
    }
    rng = random.Random(7)
    workers = [spawn_worker(**options) for _ in range(2)]
    kills = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(app_table()) < total and kills < 12:
        time.sleep(rng.uniform(0.3, 0.8))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.send(signal.SIGKILL)
        victim.wait(timeout=10)
        kills += 1
        workers.append(spawn_worker(**options))
    for worker in workers:
        worker.send(signal.SIGTERM)
        worker.wait(timeout=30)
    final = spawn_worker(**options, mode="until-idle")
    assert final.wait(timeout=60) == 0, final.log()

    assert kills >= 3
    rows = app_table()
    per_message = collections.Counter(message_id for message_id, _ in rows)
    assert set(per_message) == set(ids)
    assert max(per_message.values()) == 1, [m for m, n in per_message.items() if n > 1]
    archived = assert_all_completed_once(broker, "jobs", ids)
    # The surviving effect is the attempt that completed the message.
    attempts = dict(rows)
    assert all(archived[m].attempts == attempts[m] for m in ids)
