"""Least privilege on PostgreSQL: each group role can do its job and nothing else.

Every test gets a fresh database cloned from the migrated template, grants the group roles
on it as the superuser (the schema's owner here), and then works through login roles that
are members of one group each. A refused operation must surface as a sqlbroker error, never
as a raw psycopg exception.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

import sqlbroker
from helpers import table_counts
from pgserver import quote_ident
from sqlbroker import Saga, Step
from sqlbroker.features import security
from sqlbroker.interfaces.dashboard.api import Api
from sqlbroker.interfaces.prometheus import exposition, registry_for
from sqlbroker.storage.base import ROLE_GROUPS

pytestmark = pytest.mark.postgres

# One login role per runtime group, created once per server (roles are cluster-wide).
LOGINS = {group: f"sec_{group}_login" for group in ("producer", "consumer", "reader", "operator")}
WORKER = "sec_worker_login"  # a typical worker process: producer + consumer

SAGA = Saga("ship", [Step("pack"), Step("send")], timeout=600)


@dataclass
class SecuredDatabase:
    cluster: Any
    name: str

    @property
    def admin_url(self) -> str:
        return str(self.cluster.url(self.name))

    def url(self, login: str) -> str:
        return self.admin_url.replace(f"//{self.cluster.server.superuser}@", f"//{login}@", 1)

    def broker(self, login: str, **options: Any) -> sqlbroker.Broker:
        return sqlbroker.Broker(self.url(login), **options)


def _ensure_logins(cluster: Any) -> None:
    names = security.role_names()
    statements = []
    for group, login in [*LOGINS.items(), (WORKER, WORKER)]:
        groups = ("producer", "consumer") if login == WORKER else (group,)
        members = ", ".join(quote_ident(names[g]) for g in groups)
        statements.append(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{login}')"
            f" THEN CREATE ROLE {quote_ident(login)} LOGIN IN ROLE {members}; END IF; END $$;"
        )
    cluster.execute("\n".join(statements))


@pytest.fixture
def db(pg_server: Any) -> Iterator[SecuredDatabase]:
    name = pg_server.take_clone()
    secured = SecuredDatabase(pg_server, name)
    try:
        with sqlbroker.Broker(secured.admin_url) as admin:
            security.grant_roles(admin.backend, create=True)
        _ensure_logins(pg_server)
        yield secured
    finally:
        pg_server.drop_later(name)


def _refused(operation: Any) -> sqlbroker.SqlbrokerError:
    with pytest.raises(sqlbroker.SqlbrokerError) as caught:
        operation()
    assert not isinstance(caught.value, psycopg.Error)
    assert caught.value.__cause__ is None or not isinstance(caught.value.__cause__, psycopg.Error)
    return caught.value


def test_the_grant_matrix_covers_every_table_and_is_idempotent(db: SecuredDatabase) -> None:
    with sqlbroker.Broker(db.admin_url) as admin:
        first = security.show_roles(admin.backend)
        again = security.grant_roles(admin.backend)
        tables = admin.backend.roles_tables()  # type: ignore[attr-defined]
    assert again == first
    names = security.role_names()
    assert set(first) == {names[g] for g in ROLE_GROUPS if g != "migrator"}
    assert set(first[names["reader"]]) == set(tables), "every table is readable by the reader"
    assert all(p == "SELECT" for p in first[names["reader"]].values())
    producer = first[names["producer"]]
    assert "UPDATE" not in producer.get("sqlbroker_message", "")
    assert "sqlbroker_dead" not in producer
    assert "sqlbroker_audit" not in first[names["consumer"]]


def test_grant_revokes_what_the_matrix_does_not_give(db: SecuredDatabase) -> None:
    reader = security.role_names()["reader"]
    with psycopg.connect(db.admin_url, autocommit=True) as conn:
        conn.execute(f"GRANT DELETE ON sqlbroker_audit TO {quote_ident(reader)}")
    with sqlbroker.Broker(db.admin_url) as admin:
        shown = security.grant_roles(admin.backend)
    assert shown[reader]["sqlbroker_audit"] == "SELECT"


def test_a_missing_group_role_is_a_configuration_error(db: SecuredDatabase) -> None:
    with sqlbroker.Broker(db.admin_url) as admin:
        error = _refused(lambda: security.grant_roles(admin.backend, prefix="nobody_here"))
    assert isinstance(error, sqlbroker.ConfigurationError)
    assert "nobody_here_migrator" in str(error)


def test_the_producer_publishes_and_nothing_else(db: SecuredDatabase) -> None:
    with db.broker(LOGINS["producer"]) as producer:
        first = producer.send("jobs", {"n": 1}, idempotency_key="k1", key="order-1")
        assert producer.send("jobs", {"n": 1}, idempotency_key="k1", key="order-1") == first
        producer.publish("nobody.listens", "unrouted")
        producer.publish_many([{"topic": "jobs.x", "payload": 1}])
        with psycopg.connect(db.url(LOGINS["producer"])) as conn:
            producer.send("jobs", {"n": 2}, conn=conn)  # the outbox, in the caller's transaction
        producer.sagas.start(SAGA, {"order": 1}, saga_id="s-1")
        _refused(lambda: producer.claim("jobs"))
        _refused(lambda: producer.dead_letters.purge(subscription="jobs", actor="t"))
        _refused(lambda: producer.reap())
    with db.broker(LOGINS["reader"]) as reader:
        ready = {row.subscription: row.ready for row in reader.stats()}
    assert ready["jobs"] == 2


def test_the_consumer_claims_acks_retries_dead_letters_and_reaps(db: SecuredDatabase) -> None:
    with db.broker(LOGINS["producer"]) as producer:
        producer.send_many("work", [1, 2, 3, 4])
    with db.broker(LOGINS["consumer"], lease=30) as consumer:
        consumer.subscribe("work-copy", ["work.#"])
        one, two, three, four = consumer.claim("work", limit=4)
        consumer.complete(one)
        consumer.retry(two, after=0)
        consumer.dead_letter(three, reason="bad input")
        consumer.extend(four, lease=60)
        consumer.release(four)
        assert consumer.reap()["released"] == 0
        with consumer.once("charge", "order-9") as first:
            assert first
        consumer.schedule("tick", "work", {"tick": True}, every=60)
        consumer.run_due_schedules()
        assert sorted(d.payload for d in consumer.claim("work", limit=10)) == [2, 4]
        _refused(lambda: consumer.dead_letters.purge(subscription="work", actor="t"))
        _refused(lambda: consumer.dead_letters.replay(subscription="work", actor="t"))


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # started before its worker runs
def test_a_worker_runs_handlers_sagas_and_heartbeats(db: SecuredDatabase) -> None:
    with db.broker(LOGINS["producer"]) as producer:
        producer.send_many("emails", ["a", "b", "poison"])
        producer.sagas.start(SAGA, {"order": 2}, saga_id="s-2")
    app = sqlbroker.app.Broker(db.url(WORKER), lease=30)
    seen: list[str] = []

    @app.subscriber(queue="emails", retry=sqlbroker.RetryPolicy(max_attempts=1))
    def handle(message: Any) -> None:
        if message.payload == "poison":
            raise ValueError("cannot send")
        seen.append(message.payload)

    @app.saga_step(SAGA, "pack")
    def pack(message: Any) -> dict[str, bool]:
        return {"packed": True}

    @app.saga_step(SAGA, "send")
    def send(message: Any) -> dict[str, bool]:
        return {"sent": True}

    try:
        app.run_until_idle(timeout=60)
    finally:
        app.close()
    assert sorted(seen) == ["a", "b"]
    with db.broker(LOGINS["reader"]) as reader:
        assert reader.sagas.get("s-2").status.value == "completed"
        assert [dead.payload for dead in reader.dead_letters.list(subscription="emails")] == [
            "poison"
        ]
        assert reader.workers()


def test_the_operator_cancels_with_an_audit_trail_and_a_consumer_may_not(
    db: SecuredDatabase,
) -> None:
    with db.broker(LOGINS["producer"]) as producer:
        first, second = producer.send_many("orders", [1, 2])
    with db.broker(LOGINS["consumer"]) as consumer, sqlbroker.Broker(db.admin_url) as admin:
        (running,) = consumer.claim("orders", limit=1)
        before = table_counts(admin.backend)
        _refused(lambda: consumer.cancel(second))  # a consumer may not write the audit
        assert table_counts(admin.backend) == before
    with db.broker(LOGINS["operator"]) as operator:
        assert operator.cancel(running.message_id, actor="ops", note="dup") == 1
        assert operator.cancel(second) == 1
        entries = [(e.action, e.detail) for e in operator.audit()]
    assert entries[1] == (
        "message.cancel",
        {"message_ids": [running.message_id], "cancelled": 0, "flagged": 1, "note": "dup"},
    )
    assert entries[0][1]["cancelled"] == 1
    assert first in (running.message_id, second)


def test_the_operator_replays_and_purges_with_an_audit_trail(db: SecuredDatabase) -> None:
    with db.broker(LOGINS["producer"]) as producer:
        producer.send_many("orders", [1, 2])
    with db.broker(LOGINS["consumer"]) as consumer:
        for delivery in consumer.claim("orders", limit=2):
            consumer.dead_letter(delivery, reason="broken")
    with db.broker(LOGINS["operator"]) as operator:
        dead = operator.dead_letters.list(subscription="orders")
        assert len(operator.dead_letters.replay([dead[0].id], actor="ops", note="fixed")) == 1
        assert operator.dead_letters.purge([dead[1].id], actor="ops") == 1
        assert [entry.action for entry in operator.audit()] == ["dead.purge", "dead.replay"]
        # The operator administers the queue; it holds no consumer-side state.
        _refused(lambda: operator.once("charge", "order-1").__enter__())
        _refused(lambda: operator.send("orders", 3, idempotency_key="k"))


def test_the_reader_reads_every_view_and_writes_nothing(db: SecuredDatabase) -> None:
    with db.broker(LOGINS["producer"]) as producer:
        producer.send_many("reports", [1, 2])
    with db.broker(LOGINS["consumer"]) as consumer:
        consumer.dead_letter(consumer.claim("reports")[0], reason="x")
    with db.broker(LOGINS["reader"]) as reader:
        assert {s.subscription for s in reader.stats()} == {"reports"}
        assert len(reader.pending("reports")) == 1
        assert len(reader.dead_letters.list()) == 1
        reader.archive()
        reader.metrics_series(minutes=5)
        reader.unrouted()
        reader.audit()
        reader.schedules()
        reader.sagas.list()
        reader.workers()
        api = Api(reader)
        assert api.overview()
        api.subscription("reports")
        api.dead_letters({})
        api.audit()
        assert b"sqlbroker" in exposition(registry_for(reader))
        for write in (
            lambda: reader.send("reports", 3),
            lambda: reader.claim("reports"),
            lambda: reader.dead_letters.replay(subscription="reports", actor="r"),
            lambda: reader.reap(),
            lambda: api.act("purge", {"ids": [1]}, actor="r"),
        ):
            _refused(write)


def test_runtime_roles_never_run_ddl(db: SecuredDatabase) -> None:
    with psycopg.connect(db.admin_url, autocommit=True) as conn:
        latest = conn.execute("SELECT max(version) FROM sqlbroker_schema_version").fetchone()
        conn.execute("DELETE FROM sqlbroker_schema_version WHERE version = %s", latest)
    for login in (*LOGINS.values(), WORKER):
        with db.broker(login, migrate=True) as stale:
            error = _refused(lambda b=stale: b.send("q", 1))
        assert isinstance(error, sqlbroker.SchemaError)
        assert "migrator" in str(error)
        assert "sqlbroker migrate" in str(error)
        with db.broker(login) as plain:
            error = _refused(plain.stats)
        assert isinstance(error, sqlbroker.SchemaError)
        assert "migrator" in str(error)
    with psycopg.connect(db.admin_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sqlbroker_schema_version (version, name) VALUES (%s, 'again')", latest
        )
    with db.broker(WORKER, migrate=True) as current:
        assert current.migrate() == []  # a read, not DDL: the schema is current
        for ddl in (
            lambda: security.grant_roles(current.backend),
            lambda: security.enable_tenants(current.backend),
        ):
            _refused(ddl)


def test_a_migrator_owns_a_named_schema_and_grants_it(db: SecuredDatabase) -> None:
    """The production setup: a DBA makes a schema owned by the migrator group; the deploy
    login acts as that group (``options=-c role=…`` in its URL), so the group owns every
    table it creates, and grants them; runtime logins then work in that schema."""
    cluster, names = db.cluster, security.role_names()
    schema = f"queue_{uuid.uuid4().hex[:8]}"
    deploy = f"sec_deploy_{uuid.uuid4().hex[:6]}"
    other = SecuredDatabase(
        cluster, cluster.create_database(f"sqlbroker_sec_{uuid.uuid4().hex[:12]}")
    )
    try:
        cluster.execute(
            f"CREATE ROLE {quote_ident(deploy)} LOGIN IN ROLE {quote_ident(names['migrator'])}"
        )
        with psycopg.connect(other.admin_url, autocommit=True) as conn:
            conn.execute(
                f"CREATE SCHEMA {quote_ident(schema)}"
                f" AUTHORIZATION {quote_ident(names['migrator'])}"
            )
        as_migrator = other.url(deploy) + "?options=-c%20role%3Dsqlbroker_migrator"
        with sqlbroker.Broker(as_migrator, schema=schema) as owner:
            assert owner.migrate()
            shown = security.grant_roles(owner.backend)
        assert "INSERT" in shown[names["producer"]]["sqlbroker_message"]
        with psycopg.connect(other.admin_url) as conn:
            owners = conn.execute(
                "SELECT DISTINCT tableowner::text FROM pg_tables WHERE schemaname = %s", (schema,)
            ).fetchall()
        assert owners == [(names["migrator"],)]
        with other.broker(LOGINS["producer"], schema=schema) as producer:
            producer.send("inbox", "hello")
        with other.broker(LOGINS["consumer"], schema=schema) as consumer:
            (delivery,) = consumer.claim("inbox")
            consumer.complete(delivery)
    finally:
        cluster.drop_database(other.name)
        cluster.execute(f"DROP ROLE IF EXISTS {quote_ident(deploy)}")
