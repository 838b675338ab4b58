"""A hostile tenant, replaying every attack of issue 29 (items 1 to 3) against isolation.

The database is set up the documented way, through the CLI: ``sqlbroker roles grant``,
``sqlbroker tenants add`` and ``sqlbroker tenants enable``. Two tenants, A and B, each
with a login role in every runtime group (the worst case: only the row-level policies stand
between them). The attacker, A, issues raw SQL on its own psycopg connection, as
docs/security.md allows a tenant's application to do. Every attack must be refused (an
error from PostgreSQL) or harmless (it touches no row of B's, and B's work goes on).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import sqlbroker
from pgserver import quote_ident
from sqlbroker import Saga, Step
from sqlbroker.core.observability import MinuteCounts, WorkerBeat
from sqlbroker.features import security
from sqlbroker.interfaces.cli import cli

pytestmark = pytest.mark.postgres

LOGIN_A, LOGIN_B = "hostile_a_login", "hostile_b_login"
SAGA = Saga("refund", [Step("reserve"), Step("pay")], timeout=600)
_ENV = {"SQLBROKER_URL": None, "SQLBROKER_DEBUG": None, "NO_COLOR": "1"}


class Tenants:
    def __init__(self, cluster: Any, name: str) -> None:
        self.cluster = cluster
        self.admin_url = str(cluster.url(name))

    def url(self, login: str) -> str:
        return self.admin_url.replace(f"//{self.cluster.server.superuser}@", f"//{login}@", 1)

    def broker(self, login: str, **options: Any) -> sqlbroker.Broker:
        return sqlbroker.Broker(self.url(login), **options)

    def app(self, login: str, **options: Any) -> sqlbroker.app.Broker:
        return sqlbroker.app.Broker(self.url(login), **options)

    def attacker(self) -> psycopg.Connection[Any]:
        """Tenant A's own connection, for raw SQL."""
        return psycopg.connect(self.url(LOGIN_A), autocommit=True)

    def cli(self, *args: str, login: str | None = None) -> Any:
        url = self.admin_url if login is None else self.url(login)
        return CliRunner(env=_ENV).invoke(cli, ["--url", url, *args])


def _ok(result: Any) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


@pytest.fixture
def tenants(pg_server: Any) -> Iterator[Tenants]:
    name = pg_server.take_clone()
    db = Tenants(pg_server, name)
    try:
        _ok(db.cli("roles", "grant", "--create"))
        groups = ", ".join(
            quote_ident(role)
            for group, role in security.role_names().items()
            if group != "migrator"
        )
        for login in (LOGIN_A, LOGIN_B):
            pg_server.execute(
                f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{login}')"
                f" THEN CREATE ROLE {quote_ident(login)} LOGIN IN ROLE {groups}; END IF; END $$"
            )
        _ok(db.cli("tenants", "add", "A", "--role", LOGIN_A))
        _ok(db.cli("tenants", "add", "B", "--role", LOGIN_B))
        _ok(db.cli("tenants", "enable"))
        yield db
    finally:
        pg_server.drop_later(name)


def _refused_or_harmless(conn: psycopg.Connection[Any], statement: str, *args: Any) -> None:
    """The statement either fails in PostgreSQL or changes no row."""
    try:
        with conn.transaction():
            changed = conn.execute(statement.encode(), args or None).rowcount
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.CheckViolation):
        return
    assert changed == 0, f"{statement!r} changed {changed} row(s)"


def _refused(conn: psycopg.Connection[Any], statement: str, *args: Any) -> None:
    """The statement fails for lack of rights: a policy, a privilege or a constraint."""
    with pytest.raises(psycopg.Error) as caught, conn.transaction():
        conn.execute(statement.encode(), args or None)
    refusals = (psycopg.errors.InsufficientPrivilege, psycopg.errors.CheckViolation)
    assert isinstance(caught.value, refusals), caught.value


_PLANT = """
INSERT INTO sqlbroker_message (message_id, subscription, topic, state, priority, payload,
                               content_type, max_attempts, enqueued_at, available_at{extra})
VALUES (gen_random_uuid(), %s, %s, 'available', 0, convert_to('"planted by A"', 'UTF8'),
        'application/json', 5, now(), now(){extra_value})
"""


def _plant(subscription: str, *, tenant: str | None = None) -> tuple[Any, ...]:
    """A raw insert of a message into ``subscription``: the statement, then its values."""
    if tenant is None:
        return _PLANT.format(extra="", extra_value=""), subscription, subscription
    return _PLANT.format(extra=", tenant", extra_value=", %s"), subscription, subscription, tenant


def test_a_cannot_plant_rewrite_or_delete_in_bs_future_queue(tenants: Tenants) -> None:
    with tenants.attacker() as attacker:
        _refused(attacker, *_plant("b-future"))
        # No row of a queue nobody has created yet is visible or writable either.
        assert attacker.execute("SELECT count(*) FROM sqlbroker_message").fetchone() == (0,)
    with tenants.broker(LOGIN_B) as b:
        b.send("b-future", "from B")
        (delivery,) = b.claim("b-future", limit=10)
        assert delivery.payload == "from B"
        with tenants.attacker() as attacker:
            _refused_or_harmless(
                attacker, "UPDATE sqlbroker_message SET payload = convert_to('1', 'UTF8')"
            )
            _refused_or_harmless(attacker, "DELETE FROM sqlbroker_message")
            _refused_or_harmless(
                attacker, "DELETE FROM sqlbroker_message WHERE subscription = 'b-future'"
            )
        b.complete(delivery)  # B's running row is still B's: no LeaseLost
        b.send("b-future", "second")
        assert [d.payload for d in b.claim("b-future", limit=10)] == ["second"]


def test_a_row_a_marks_for_b_is_refused_and_a_queues_stay_as(tenants: Tenants) -> None:
    with tenants.broker(LOGIN_A) as a:
        a.send("a-jobs", "of A")
    with tenants.attacker() as attacker:
        _refused(attacker, *_plant("a-jobs", tenant="B"))
        _refused_or_harmless(attacker, "UPDATE sqlbroker_message SET tenant = 'B'")
    with tenants.broker(LOGIN_B) as b:
        assert b.claim("a-jobs", limit=10) == []
        assert b.pending("a-jobs") == []
    with psycopg.connect(tenants.url(LOGIN_B)) as conn:
        assert conn.execute("SELECT count(*) FROM sqlbroker_message").fetchone() == (0,)
    with tenants.broker(LOGIN_A) as a:
        assert [d.payload for d in a.claim("a-jobs", limit=10)] == ["of A"]


def _count_metrics(broker: sqlbroker.Broker, worker: str, subscription: str, done: int) -> None:
    """What a worker of ``broker``'s tenant writes with its heartbeat: a minute, and totals."""
    minute = broker.backend.now().replace(second=0, microsecond=0)
    broker.backend.worker_beat(
        beat=WorkerBeat(name=worker, host="h", pid=1, subscriptions=(subscription,)),
        minutes=[MinuteCounts(subscription, minute, worker, completed=done, handler_count=done)],
        totals={(subscription, "completed"): done},
    )


def test_tenants_assign_takes_the_queue_and_its_messages_away(tenants: Tenants) -> None:
    with tenants.broker(LOGIN_A) as a:
        a.send("handover", "dead")
        a.dead_letter(a.claim("handover")[0], reason="before the handover")
        a.send("handover", "done")
        a.complete(a.claim("handover")[0])
        a.send_many("handover", ["one", "two"])
        _count_metrics(a, "worker-of-a", "handover", 3)
    _ok(tenants.cli("tenants", "assign", "handover", "--tenant", "B"))
    with tenants.attacker() as attacker:
        seen = "SELECT count(*) FROM sqlbroker_message WHERE subscription = 'handover'"
        assert attacker.execute(seen).fetchone() == (0,)
        _refused_or_harmless(attacker, "DELETE FROM sqlbroker_message")
        _refused_or_harmless(attacker, "UPDATE sqlbroker_message SET priority = 0")
        _refused(attacker, *_plant("handover"))
        assert attacker.execute("SELECT count(*) FROM sqlbroker_dead").fetchone() == (0,)
    with tenants.broker(LOGIN_A) as a:
        assert a.claim("handover", limit=10) == []
        assert a.pending("handover") == []
        assert a.dead_letters.list() == []
        assert a.dead_letters.purge(subscription="handover", actor="a") == 0
        assert a.archive() == []
        assert a.backend.metric_totals() == {}
    with tenants.broker(LOGIN_B) as b:
        assert b.backend.metric_totals() == {("handover", "completed"): 3}
        assert sorted(d.payload for d in b.claim("handover", limit=10)) == ["one", "two"]
        assert [d.payload for d in b.dead_letters.list()] == ["dead"]
        assert [row.payload for row in b.archive()] == ["done"]


_LEFTOVERS = (
    "SELECT (SELECT count(*) FROM sqlbroker_dead WHERE subscription = %(name)s),"
    " (SELECT count(*) FROM sqlbroker_archive WHERE subscription = %(name)s),"
    " (SELECT count(*) FROM sqlbroker_metric_minute WHERE subscription = %(name)s),"
    " (SELECT count(*) FROM sqlbroker_metric_total WHERE subscription = %(name)s)"
)


def test_a_deleted_subscriptions_leftovers_stay_with_its_tenant(tenants: Tenants) -> None:
    # A's queue leaves dead letters, archive rows and metrics behind when A deletes it.
    with tenants.broker(LOGIN_A) as a:
        a.send("reused", "dead of A")
        a.dead_letter(a.claim("reused")[0], reason="A's failure")
        a.send("reused", "done by A")
        a.complete(a.claim("reused")[0])
        _count_metrics(a, "worker-of-a", "reused", 7)
        assert a.unsubscribe("reused")
    # B takes the name, free again, and sees nothing of A's under it: not through the
    # API, nor counting rows in raw SQL.
    with tenants.broker(LOGIN_B) as b:
        b.send("reused", "of B")
        assert b.dead_letters.list() == []
        assert b.dead_letters.list(subscription="reused") == []
        assert b.archive() == []
        assert b.backend.metric_totals() == {}
        assert [p.completed for p in b.metrics_series()["reused"] if p.completed] == []
        (stats,) = b.stats()
        assert (stats.subscription, stats.ready, stats.dead, stats.completed_per_minute) == (
            "reused",
            1,
            0,
            0,
        )
        assert b.dead_letters.replay(subscription="reused", actor="b") == []
        assert b.dead_letters.purge(subscription="reused", actor="b") == 0
        # B's own counters of the name neither meet A's nor add to them.
        _count_metrics(b, "worker-of-b", "reused", 2)
        assert b.backend.metric_totals() == {("reused", "completed"): 2}
    with psycopg.connect(tenants.url(LOGIN_B), autocommit=True) as victim:
        assert victim.execute(_LEFTOVERS, {"name": "reused"}).fetchone() == (0, 0, 1, 1)
        # Nor may B change or delete them (B itself has no dead letter nor archive row).
        for statement in (
            "UPDATE sqlbroker_dead SET reason = 'changed by B'",
            "DELETE FROM sqlbroker_dead",
            "DELETE FROM sqlbroker_archive",
            "DELETE FROM sqlbroker_metric_minute WHERE worker = 'worker-of-a'",
        ):
            _refused_or_harmless(victim, statement)
    # A keeps them (dead letters are audit-relevant; retention trims A's rows for A), and
    # can neither replay one into B's queue of that name nor plant rows for B there.
    with tenants.broker(LOGIN_A) as a:
        assert [d.payload for d in a.dead_letters.list()] == ["dead of A"]
        assert [row.payload for row in a.archive()] == ["done by A"]
        assert a.backend.metric_totals() == {("reused", "completed"): 7}
        with pytest.raises(sqlbroker.StorageError, match="row-level security"):
            a.dead_letters.replay(subscription="reused", actor="a")
        assert [d.payload for d in a.dead_letters.list()] == ["dead of A"]
        assert a.dead_letters.purge(subscription="reused", actor="a") == 1
    with tenants.attacker() as attacker:
        _refused(
            attacker,
            "INSERT INTO sqlbroker_archive (message_id, subscription, topic, outcome, priority,"
            " payload, content_type, attempts, max_attempts, replay_count, enqueued_at,"
            " finished_at, tenant) VALUES (gen_random_uuid(), 'reused', 'reused', 'completed',"
            " 0, convert_to('1', 'UTF8'), 'application/json', 1, 5, 0, now(), now(), 'B')",
        )
        _refused(
            attacker,
            "INSERT INTO sqlbroker_dead (delivery_id, message_id, subscription, topic,"
            " priority, payload, content_type, attempts, max_attempts, replay_count, reason,"
            " enqueued_at, first_failed_at, last_failed_at, dead_at, tenant) VALUES (1,"
            " gen_random_uuid(), 'reused', 'reused', 0, convert_to('1', 'UTF8'),"
            " 'application/json', 5, 5, 0, 'planted', now(), now(), now(), now(), 'B')",
        )
        _refused(
            attacker,
            "INSERT INTO sqlbroker_metric_total (subscription, outcome, count, tenant)"
            " VALUES ('reused', 'completed', 1000, 'B')",
        )
        _refused_or_harmless(attacker, "UPDATE sqlbroker_archive SET tenant = 'B'")
        _refused_or_harmless(attacker, "UPDATE sqlbroker_dead SET tenant = 'B'")
        _refused_or_harmless(attacker, "UPDATE sqlbroker_metric_total SET tenant = 'B'")
    with tenants.broker(LOGIN_B) as b:
        assert b.archive() == []
        assert b.backend.metric_totals() == {("reused", "completed"): 2}
        assert [d.payload for d in b.claim("reused")] == ["of B"]


def _wait_until_due(broker: sqlbroker.Broker, name: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        (schedule,) = [s for s in broker.schedules() if s.name == name]
        if schedule.next_run_at <= broker.backend.now():
            return
        assert time.monotonic() < deadline, "the schedule never became due"
        time.sleep(0.05)


def test_schedules_fire_only_under_their_owners_routing(tenants: Tenants) -> None:
    seen_by_b: list[Any] = []
    app_b = tenants.app(LOGIN_B)

    @app_b.subscriber("b-orders", topics=["orders.#"])
    def handle(message: Any) -> None:
        seen_by_b.append(message.payload)

    with tenants.broker(LOGIN_A) as a, tenants.broker(LOGIN_B) as b:
        a.subscribe("a-refunds", ["orders.#"])
        a.schedule("refund", "orders.refund", {"order": 7}, every=1)
        _wait_until_due(a, "refund")

        # A real worker of B, with its scheduler, and B's public API: neither fires A's.
        try:
            app_b.run(timeout=2.0, install_signal_handlers=False)
        finally:
            app_b.close()
        assert b.run_due_schedules().published == {}
        assert seen_by_b == []
        assert b.claim("b-orders", limit=10) == []
        (own,) = a.schedules()
        assert own.last_run_at is None  # nobody but A fired it
        # B may use the same name: its own schedule, which leaves A's alone.
        b.schedule("refund", "orders.other", {"of": "B"}, every=3600)
        assert [s.payload for s in a.schedules()] == [{"order": 7}]

        run = a.run_due_schedules()
        assert list(run.published) == ["refund"]
        assert [d.payload for d in a.claim("a-refunds", limit=10)] == [{"order": 7}]
        assert b.claim("b-orders", limit=10) == []


def test_a_cannot_halt_schedules_with_times_nobody_can_read(tenants: Tenants) -> None:
    with tenants.broker(LOGIN_A) as a, tenants.broker(LOGIN_B) as b:
        a.schedule("a-tick", "a.tick", 1, every=3600)
        b.subscribe("b-ticks", ["b.tick"])
        b.schedule("b-tick", "b.tick", {"tick": "B"}, every=1)
        with tenants.attacker() as attacker:
            for change in (
                "last_run_at = 'infinity'",
                "next_run_at = '-infinity'",
                "next_run_at = '20000-01-01 00:00+00'",
            ):
                _refused_or_harmless(
                    attacker, f"UPDATE sqlbroker_schedule SET {change} WHERE name <> 'a-tick'"
                )
            _refused_or_harmless(
                attacker, "UPDATE sqlbroker_schedule SET paused = true WHERE name <> 'a-tick'"
            )
            _refused_or_harmless(attacker, "DELETE FROM sqlbroker_schedule WHERE name <> 'a-tick'")
            # Not even A's own row may take a time no scheduler can read, nor go to B.
            _refused(attacker, "UPDATE sqlbroker_schedule SET last_run_at = 'infinity'")
            _refused(attacker, "UPDATE sqlbroker_schedule SET tenant = 'B'")
        assert [s.name for s in a.schedules()] == ["a-tick"]
        _wait_until_due(b, "b-tick")
        assert list(b.run_due_schedules().published) == ["b-tick"]
        assert [d.payload for d in b.claim("b-ticks")] == [{"tick": "B"}]
        assert [s.name for s in b.schedules()] == ["b-tick"]


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # no worker serves it
def test_a_cannot_change_bs_saga(tenants: Tenants) -> None:
    with tenants.broker(LOGIN_B) as b:
        b.sagas.start(SAGA, {"amount": 12}, saga_id="b-saga")
    with tenants.attacker() as attacker:
        _refused_or_harmless(attacker, """UPDATE sqlbroker_saga SET data = '{"amount": 99999}'""")
        _refused_or_harmless(attacker, "UPDATE sqlbroker_saga SET status = 'completed'")
        _refused_or_harmless(attacker, "UPDATE sqlbroker_saga_step SET status = 'done'")
        _refused(
            attacker,
            "INSERT INTO sqlbroker_saga_step (saga_id, idx, name, compensate, status)"
            " VALUES ('b-saga', 9, 'extra', false, 'pending')",
        )
        assert attacker.execute("SELECT count(*) FROM sqlbroker_saga_step").fetchone() == (0,)
    with tenants.broker(LOGIN_B) as b:
        saga = b.sagas.get("b-saga")
        assert saga is not None
        assert saga.data == {"amount": 12}
        assert saga.status.value == "running"
    with tenants.broker(LOGIN_A) as a:
        with pytest.raises(sqlbroker.NotFound):
            a.sagas.get("b-saga")
        assert a.sagas.list() == []


def test_a_cannot_skip_or_repeat_bs_effects(tenants: Tenants) -> None:
    with tenants.broker(LOGIN_B) as b, b.once("charge", "order-9") as first:
        assert first
    with tenants.attacker() as attacker:
        _refused_or_harmless(attacker, "DELETE FROM sqlbroker_processed")
        _refused_or_harmless(
            attacker, "UPDATE sqlbroker_processed SET expires_at = now() - interval '1 hour'"
        )
        # A key A records for itself is A's alone, whatever its scope and key.
        attacker.execute(
            "INSERT INTO sqlbroker_processed (scope, key, state, token, reserved_until,"
            " created_at, done_at, expires_at) VALUES ('charge', 'order-10', 'done',"
            " gen_random_uuid(), now(), now(), now(), now() + interval '1 day')"
        )
    with tenants.broker(LOGIN_B) as b:
        with b.once("charge", "order-9") as first:
            assert not first  # done once: not run twice
        with b.once("charge", "order-10") as first:
            assert first  # never done by B: not skipped


def _alive(broker: sqlbroker.Broker) -> list[Any]:
    return [w for w in broker.workers() if w.stopped_at is None and w.seen_age < 30]


def test_a_cannot_fail_bs_liveness_probe(tenants: Tenants) -> None:
    # A takes the name B's worker will use (host:pid, easy to guess under Kubernetes).
    name = f"{socket.gethostname()}:{os.getpid()}"
    with tenants.attacker() as attacker:
        attacker.execute(
            "INSERT INTO sqlbroker_worker (name, host, pid, subscriptions, started_at, seen_at,"
            " stopped_at) VALUES (%s, 'x', 1, '[]', '2000-01-01', '2000-01-01', '2000-01-01')",
            (name,),
        )
    app_b = tenants.app(LOGIN_B)

    @app_b.subscriber(queue="b-work")
    def handle(message: Any) -> None:
        pass

    runner = threading.Thread(
        target=lambda: app_b.run(timeout=60, install_signal_handlers=False, heartbeat_interval=0.5),
        daemon=True,
    )
    runner.start()
    try:
        with tenants.broker(LOGIN_B) as b:
            deadline = time.monotonic() + 30
            while not _alive(b):
                assert time.monotonic() < deadline, "B's worker never sent a heartbeat"
                time.sleep(0.05)
            with tenants.attacker() as attacker:
                for attack in (
                    "UPDATE sqlbroker_worker SET seen_at = '2000-01-01', stopped_at = now()"
                    " WHERE host <> 'x'",
                    "DELETE FROM sqlbroker_worker WHERE host <> 'x'",
                ):
                    _refused_or_harmless(attacker, attack)
            assert [w.name for w in _alive(b)] == [name]
            probe = tenants.cli("healthcheck", "--probe", "liveness", login=LOGIN_B)
            assert probe.exit_code == 0, probe.stdout
    finally:
        app_b.stop()
        runner.join(timeout=60)
        app_b.close()


def test_a_cannot_forge_bs_audit_trail(tenants: Tenants) -> None:
    with tenants.attacker() as attacker:
        attacker.execute(
            "INSERT INTO sqlbroker_audit (at, actor, action, detail)"
            " VALUES (now(), 'b-admin', 'dead.purge', '{}')"
        )
        with tenants.broker(LOGIN_B) as b:
            assert b.audit() == []
        _refused(
            attacker,
            "INSERT INTO sqlbroker_audit (at, actor, action, detail, tenant)"
            " VALUES (now(), 'b-admin', 'dead.purge', '{}', 'B')",
        )
    with tenants.broker(LOGIN_B) as b:
        assert b.audit() == []


def test_spark_rows_are_per_tenant(tenants: Tenants) -> None:
    with tenants.broker(LOGIN_B) as b:
        b.send("b-stream", "for Spark")
    with psycopg.connect(tenants.url(LOGIN_B), autocommit=True) as victim:
        victim.execute(
            "INSERT INTO sqlbroker_spark_stage (job_id, partition_id, attempt, seq, topic,"
            " payload, content_type, priority, content_hash, max_attempts, dedupe_window,"
            " staged_at) VALUES ('job-b', 0, 0, 0, 'b.topic', convert_to('1', 'UTF8'),"
            " 'application/json', 2, 'h', 5, 60, now())"
        )
        victim.execute(
            "INSERT INTO sqlbroker_spark_stream (name, subscription, created_at)"
            " VALUES ('b-reader', 'b-stream', now())"
        )
    with tenants.attacker() as attacker:
        for table in ("sqlbroker_spark_stage", "sqlbroker_spark_stream"):
            assert attacker.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
            _refused_or_harmless(attacker, f"DELETE FROM {table}")
        _refused(
            attacker,
            "INSERT INTO sqlbroker_spark_stream (name, subscription, created_at)"
            " VALUES ('a-reader', 'b-stream', now())",
        )
    with psycopg.connect(tenants.url(LOGIN_B), autocommit=True) as victim:
        staged = victim.execute("SELECT count(*) FROM sqlbroker_spark_stage").fetchone()
        streams = victim.execute("SELECT name FROM sqlbroker_spark_stream").fetchall()
    assert staged == (1,)
    assert streams == [("b-reader",)]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A small local SparkSession (one executor thread), for the one Spark test below."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from sqlbroker.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[1]")
        .appName("sqlbroker-hostile-tenant")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.mark.spark
def test_a_tenants_spark_write_and_reads_stay_its_own(tenants: Tenants, spark: Any) -> None:
    # Both tenants route orders.#; B writes a DataFrame under its own login.
    with tenants.broker(LOGIN_A) as a, tenants.broker(LOGIN_B) as b:
        a.subscribe("a-orders", ["orders.#"])
        b.subscribe("b-orders", ["orders.#"])
    orders = spark.range(0, 12, 1, 2).selectExpr("id AS order_id")
    orders.write.format("sqlbroker").option("url", tenants.url(LOGIN_B)).option(
        "topic", "orders.created"
    ).mode("append").save()

    def read(login: str, table: str = "messages") -> int:
        reader = spark.read.format("sqlbroker").option("url", tenants.url(login))
        return int(reader.option("table", table).load().count())

    assert read(LOGIN_B) == 12
    for table in ("messages", "archive", "dead"):
        assert read(LOGIN_A, table) == 0
    with tenants.broker(LOGIN_A) as a, tenants.broker(LOGIN_B) as b:
        assert a.claim("a-orders", limit=100) == []
        claimed = b.claim("b-orders", limit=100)
        assert sorted(d.payload["order_id"] for d in claimed) == list(range(12))
        b.complete(claimed)
    assert read(LOGIN_B, "archive") == 12
    assert read(LOGIN_A, "archive") == 0
