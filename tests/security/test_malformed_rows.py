"""Rows damaged by raw SQL — as a superuser, a migration script or an older version could
write them — break nothing that reads them (issue 29, item 4; docs/security.md, "Damaged
rows"), on both backends.

Each test writes real rows through the API, damages them with raw SQL on a connection of
its own (the PostgreSQL superuser), and then drives every reader: claims (the low-level
``claim`` and the worker), listings (API and CLI), the dashboard's JSON API, Prometheus,
the health check, ``stats``, routing and the scheduler.
"""

from __future__ import annotations

import sqlite3
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from click.testing import CliRunner, Result

import sqlbroker
from helpers import claim_one
from sqlbroker.core.observability import MinuteCounts, WorkerBeat
from sqlbroker.interfaces import prometheus
from sqlbroker.interfaces.cli import cli
from sqlbroker.interfaces.dashboard import Dashboard

Raw = Callable[..., None]


@pytest.fixture
def raw(backend_url: str, request: pytest.FixtureRequest) -> Raw:
    """``raw(sql, *params)``: one statement (``?`` placeholders) on a connection of its own,
    committed; on PostgreSQL as the superuser."""
    if backend_url.startswith("sqlite"):
        path = backend_url.removeprefix("sqlite:///")

        def run_sqlite(sql: str, *params: Any) -> None:
            with closing(sqlite3.connect(path)) as conn:
                conn.execute(sql, params)
                conn.commit()

        return run_sqlite
    cluster = request.getfixturevalue("pg_server")
    admin_url = str(cluster.url(urlsplit(backend_url).path.lstrip("/")))

    def run_postgres(sql: str, *params: Any) -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.replace("?", "%s"), params)

    return run_postgres


def cli_run(url: str, *args: str) -> Result:
    env = {"SQLBROKER_URL": None, "NO_COLOR": "1", "SQLBROKER_DEBUG": None}
    return CliRunner(env=env).invoke(cli, ["--url", url, *args])


def cli_ok(url: str, *args: str) -> str:
    result = cli_run(url, *args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.output


def get_json(board: Dashboard, path: str) -> tuple[int, Any]:
    import json

    try:
        with urllib.request.urlopen(board.url.rstrip("/") + path, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


@pytest.fixture
def board(broker: sqlbroker.Broker) -> Iterator[Dashboard]:
    dashboard = Dashboard(broker, port=0)
    dashboard.start()
    yield dashboard
    dashboard.stop()


BAD_HEADERS = ["[1, 2]", '{"a": 1}', "not json", '"text"']


def test_a_claim_dead_letters_rows_that_do_not_decode(broker: sqlbroker.Broker, raw: Raw) -> None:
    for n in range(len(BAD_HEADERS) + 1):
        broker.send("jobs", {"n": n})
    ids = sorted(p.id for p in broker.pending("jobs"))
    for delivery_id, headers in zip(ids, BAD_HEADERS, strict=False):
        raw("UPDATE sqlbroker_message SET headers = ? WHERE id = ?", headers, delivery_id)

    claimed = broker.claim("jobs", limit=10)

    assert [d.payload for d in claimed] == [{"n": len(BAD_HEADERS)}]
    dead = broker.dead_letters.list()
    assert sorted(d.payload["n"] for d in dead) == list(range(len(BAD_HEADERS)))
    for letter in dead:
        assert letter.reason.startswith("undecodable: headers"), letter.reason
        assert letter.error_type == "sqlbroker.Undecodable"
        assert letter.damaged is not None
        assert letter.damaged.startswith("headers")
    # Nothing damaged was released to crash the next claim.
    assert broker.claim("jobs", limit=10) == []
    broker.complete(claimed)


def test_the_worker_keeps_running_and_dead_letters_the_damaged_message(
    broker: sqlbroker.Broker, raw: Raw
) -> None:
    handled: list[Any] = []

    @broker.subscriber(queue="jobs")
    def handle(msg: sqlbroker.Message) -> None:
        handled.append(msg.payload)

    for n in range(3):
        broker.send("jobs", {"n": n})
    first = min(p.id for p in broker.pending("jobs"))
    raw("UPDATE sqlbroker_message SET headers = ? WHERE id = ?", "[1]", first)

    broker.run_until_idle(timeout=60)

    assert sorted(p["n"] for p in handled) == [1, 2]
    (dead,) = broker.dead_letters.list()
    assert dead.payload == {"n": 0}
    assert dead.reason == "undecodable: headers is a JSON list, not an object"
    assert broker.pending("jobs") == []


def test_sqlite_columns_of_the_wrong_type_are_dead_lettered_at_claim(tmp_path: Any) -> None:
    """SQLite keeps whatever a statement gives a column: text in a time or number column."""
    url = f"sqlite:///{tmp_path}/typed.db"
    with sqlbroker.Broker(url) as broker:
        broker.send("jobs", 1)
        broker.send("jobs", 2)
        first, second = sorted(p.id for p in broker.pending("jobs"))
        with closing(sqlite3.connect(tmp_path / "typed.db")) as conn:
            conn.execute(
                "UPDATE sqlbroker_message SET enqueued_at = 'yesterday' WHERE id = ?", (first,)
            )
            conn.execute("UPDATE sqlbroker_message SET payload = 'text' WHERE id = ?", (second,))
            conn.commit()
        # A text payload is its UTF-8 bytes: still a message.
        (delivery,) = broker.claim("jobs", limit=10)
        assert delivery.payload == b"text"
        (dead,) = broker.dead_letters.list()
        assert dead.reason == "undecodable: enqueued_at is a str of 9, not a time"
        assert dead.damaged == "enqueued_at is a str of 9, not a time"
        assert "is damaged: enqueued_at" in cli_ok(url, "dlq", "list")


def test_sqlite_listings_and_stats_survive_columns_of_the_wrong_type(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/listed.db"
    with sqlbroker.Broker(url) as broker:
        broker.send("jobs", 1)
        broker.subscribe("orders", ["orders.#"])
        with closing(sqlite3.connect(tmp_path / "listed.db")) as conn:
            conn.execute("UPDATE sqlbroker_message SET available_at = 'soon'")
            conn.execute("UPDATE sqlbroker_subscription SET created_at = 'then'")
            conn.commit()
        (pending,) = broker.pending()
        assert pending.damaged == "available_at is a str of 4, not a time"
        assert {s.name: s.damaged for s in broker.subscriptions()}["orders"] == (
            "created_at is a str of 4, not a time"
        )
        (jobs,) = [s for s in broker.stats() if s.subscription == "jobs"]
        assert jobs.oldest_ready_age is None
        assert "is damaged: available_at" in cli_ok(url, "pending")
        assert "name orders is damaged: created_at" in cli_ok(url, "subscriptions")
        cli_ok(url, "stats")


def test_listings_show_damaged_rows_by_id(broker: sqlbroker.Broker, raw: Raw) -> None:
    url = broker.url
    broker.send("jobs", {"n": 1})
    broker.send("jobs", {"n": 2})
    broker.send("jobs", {"n": 3})
    broker.dead_letter(claim_one(broker, "jobs"), reason="bad input")
    broker.complete(claim_one(broker, "jobs"))
    raw("UPDATE sqlbroker_dead SET headers = 'not json'")
    raw("UPDATE sqlbroker_archive SET headers = '[1]'")

    (dead,) = broker.dead_letters.list()
    assert dead.damaged == "headers is not JSON"
    assert dead.payload == {"n": 1}
    assert dead.reason == "bad input"
    assert broker.dead_letters.get(dead.id).damaged == "headers is not JSON"
    (archived,) = broker.archive()
    assert archived.damaged == "headers is a JSON list, not an object"

    assert f"id {dead.id} is damaged: headers is not JSON" in cli_ok(url, "dlq", "list")
    assert "headers is not JSON" in cli_ok(url, "dlq", "show", str(dead.id))
    assert '"damaged": "headers is not JSON"' in cli_ok(url, "dlq", "list", "--json")
    assert "is damaged: headers is a JSON list" in cli_ok(url, "archive")
    cli_ok(url, "pending")
    cli_ok(url, "stats")


def test_the_dashboard_answers_with_damaged_rows(
    broker: sqlbroker.Broker, board: Dashboard, raw: Raw
) -> None:
    broker.send("jobs", {"n": 1})
    broker.dead_letter(claim_one(broker, "jobs"), reason="bad input")
    (dead,) = broker.dead_letters.list()
    broker.dead_letters.replay([dead.id], actor="test")
    broker.dead_letter(claim_one(broker, "jobs"), reason="bad again")
    raw("UPDATE sqlbroker_dead SET headers = '[1]'")
    raw("UPDATE sqlbroker_audit SET detail = '[1]'")

    status, listing = get_json(board, "/api/dead")
    assert status == 200
    assert [row["damaged"] for row in listing["dead_letters"]] == [
        "headers is a JSON list, not an object"
    ]
    assert listing["audit"][0]["damaged"] == "detail is a JSON list, not an object"
    (row,) = listing["dead_letters"]
    status, detail = get_json(board, f"/api/dead/{row['id']}")
    assert status == 200
    assert detail["dead_letter"]["damaged"].startswith("headers")
    assert get_json(board, "/api/audit")[0] == 200
    assert "is damaged: detail is a JSON list" in cli_ok(broker.url, "audit")
    assert get_json(board, "/api/overview")[0] == 200
    assert get_json(board, "/api/subscriptions/jobs")[0] == 200


def test_workers_metrics_and_health_survive_damaged_observability_rows(
    broker: sqlbroker.Broker, raw: Raw, board: Dashboard
) -> None:
    import socket

    backend = broker.backend
    minute = backend.now().replace(second=0, microsecond=0)
    for name in ("w-ok", "w-bad"):
        backend.worker_beat(
            beat=WorkerBeat(
                name=name, host=socket.gethostname(), pid=1, subscriptions=("jobs",), starting=True
            ),
            minutes=[MinuteCounts(subscription="jobs", minute=minute, worker=name, completed=1)],
            totals={("jobs", "completed"): 1},
        )
    raw("UPDATE sqlbroker_worker SET subscriptions = '5' WHERE name = 'w-bad'")
    raw("UPDATE sqlbroker_metric_minute SET handler_buckets = '{\"x\": 1}' WHERE worker = 'w-bad'")

    workers = {w.name: w for w in broker.workers()}
    assert workers["w-bad"].damaged == "subscriptions is not a JSON list of strings"
    assert workers["w-ok"].damaged is None
    # The damaged minute row is left out; the sound one still counts.
    assert sum(p.completed for p in broker.metrics_series(minutes=5)["jobs"]) == 1
    broker.stats()
    text = prometheus.exposition(prometheus.registry_for(broker)).decode()
    assert "sqlbroker_workers_alive 1.0" in text
    result = cli_run(broker.url, "healthcheck", "--probe", "liveness")
    assert result.exit_code == 0, result.output
    status, overview = get_json(board, "/api/overview")
    assert status == 200
    assert overview["workers_alive"] == 1


def test_a_damaged_pattern_row_cannot_break_routing(broker: sqlbroker.Broker, raw: Raw) -> None:
    broker.subscribe("good", ["orders.*"])
    broker.subscribe("bad-regex", ["orders.#"])
    broker.subscribe("bad-pattern", ["orders.created"])
    raw("UPDATE sqlbroker_subscription_pattern SET regex = '(' WHERE subscription = 'bad-regex'")
    raw(
        "UPDATE sqlbroker_subscription_pattern SET pattern = 'orders.(', regex = '^.*$'"
        " WHERE subscription = 'bad-pattern'"
    )

    message_id = broker.publish("orders.created", {"n": 1})
    broker.publish_many([{"topic": "orders.paid", "payload": 2}, {"topic": "other", "payload": 3}])

    # Routing reads the pattern: the stored regex is never used, a damaged pattern matches
    # nothing.
    routed = {p.subscription for p in broker.pending() if p.message_id == message_id}
    assert routed == {"good", "bad-regex"}
    assert len(broker.pending("bad-regex")) == 2
    assert broker.pending("bad-pattern") == []
    listed = {s.name: s for s in broker.subscriptions()}
    assert listed["bad-pattern"].patterns == ()
    assert listed["bad-pattern"].damaged == "pattern 'orders.(' is not a valid pattern"
    assert "name bad-pattern is damaged" in cli_ok(broker.url, "subscriptions")


def test_a_damaged_schedule_is_listed_but_never_fired(broker: sqlbroker.Broker, raw: Raw) -> None:
    broker.subscribe("ticks", ["tick.#"])
    broker.schedule("good", "tick.good", {"n": 1}, every=60)
    broker.schedule("bad", "tick.bad", {"n": 2}, every=60)
    raw("UPDATE sqlbroker_schedule SET headers = '[1]' WHERE name = 'bad'")
    due = broker.backend.now().timestamp() - 1 if broker.backend_name == "sqlite" else None
    if due is None:
        raw("UPDATE sqlbroker_schedule SET next_run_at = now() - interval '1 second'")
    else:
        raw("UPDATE sqlbroker_schedule SET next_run_at = ?", due)

    run = broker.run_due_schedules()

    assert set(run.published) == {"good"}
    assert [p.topic for p in broker.pending("ticks")] == ["tick.good"]
    listed = {s.name: s for s in broker.schedules()}
    assert set(listed) == {"good", "bad"}
    assert listed["bad"].headers == {}
    cli_ok(broker.url, "schedules")


def test_a_damaged_saga_fails_its_step_instead_of_running_it(tmp_path: Any) -> None:
    """Saga data is jsonb on PostgreSQL; SQLite's text column can hold anything."""
    url = f"sqlite:///{tmp_path}/saga.db"
    order = sqlbroker.Saga("order", [sqlbroker.Step("reserve", compensate=False)])
    with sqlbroker.Broker(url) as broker:
        ran: list[Any] = []

        @broker.saga_step(order, "reserve")
        def reserve(ctx: sqlbroker.StepContext) -> None:
            ran.append(ctx.data)

        saga_id = broker.sagas.start(order, {"order": 1})
        with closing(sqlite3.connect(tmp_path / "saga.db")) as conn:
            conn.execute("UPDATE sqlbroker_saga SET data = 'not json'")
            conn.commit()
        (listed,) = broker.sagas.list()
        assert listed.damaged == "data is not JSON"
        assert broker.sagas.get(saga_id).damaged == "data is not JSON"
        assert f"id {saga_id} is damaged: data is not JSON" in cli_ok(url, "saga", "list")
        cli_ok(url, "saga", "show", saga_id)

        broker.run_until_idle(timeout=60)

        assert ran == []
        assert broker.sagas.get(saga_id).status is not sqlbroker.SagaStatus.RUNNING


def test_a_refused_fan_out_does_not_hold_the_sqlite_write_lock(tmp_path: Any) -> None:
    """A publish past max_copies stops while counting, before it writes a copy: another
    process's writer, with a short busy timeout, never waits it out (issue 29, item 6)."""
    url = f"sqlite:///{tmp_path}/lock.db"
    with sqlbroker.Broker(url) as publisher, sqlbroker.Broker(url, busy_timeout=1.0) as other:
        for index in range(300):
            publisher.subscribe(f"s{index}", ["big.#"])
        other.send("side", 0)
        stop = threading.Event()
        busy: list[Exception] = []

        def write() -> None:
            while not stop.is_set():
                try:
                    other.send("side", 1)
                except sqlbroker.DatabaseBusy as error:
                    busy.append(error)
                    return

        writer = threading.Thread(target=write)
        writer.start()
        try:
            with pytest.raises(sqlbroker.LimitExceeded) as refused:
                publisher.publish_many([{"topic": "big.x", "payload": "x" * 1000}] * 100)
        finally:
            stop.set()
            writer.join()
        assert busy == []
        assert refused.value.field == "max_copies"
        assert publisher.pending("s0") == []


@pytest.mark.postgres
def test_infinite_times_on_postgresql_are_damage_not_a_failed_statement(
    pg_url: str, request: pytest.FixtureRequest
) -> None:
    """psycopg cannot load 'infinity' into a datetime: one such value used to fail every
    statement reading its row — a claim after it had committed the lease."""
    cluster = request.getfixturevalue("pg_server")
    admin = str(cluster.url(urlsplit(pg_url).path.lstrip("/")))
    with sqlbroker.Broker(pg_url) as broker:
        broker.send("jobs", 1)
        broker.send("jobs", 2)
        first = min(p.id for p in broker.pending("jobs"))
        backend = broker.backend
        backend.worker_beat(
            beat=WorkerBeat(name="w-inf", host="h", pid=1, subscriptions=("jobs",), starting=True),
            minutes=[],
            totals={},
        )
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                "UPDATE sqlbroker_message SET expires_at = 'infinity', enqueued_at = '-infinity'"
                " WHERE id = %s",
                (first,),
            )
            conn.execute("UPDATE sqlbroker_worker SET seen_at = 'infinity'")
        (delivery,) = broker.claim("jobs", limit=10)
        assert delivery.payload == 2
        (dead,) = broker.dead_letters.list()
        infinite = "is infinity, not a time"
        assert dead.reason == f"undecodable: enqueued_at {infinite}; expires_at {infinite}"
        (worker,) = broker.workers()
        assert worker.damaged == "seen_at is infinity, not a time; seen_age is NULL, not a number"
        assert prometheus.exposition(prometheus.registry_for(broker))
