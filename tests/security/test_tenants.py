"""Tenant isolation with row-level security, on the real server with two tenant logins.

Each tenant's login role holds every runtime group, so only the row-level policies stand
between them; the tenant is bound to the login role, so even SQL the tenant writes itself on
its own connection cannot see or touch the other tenant's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sqlbroker
from pgserver import quote_ident
from sqlbroker.core.settlements import Lease
from sqlbroker.core.topics import validate_topic
from sqlbroker.features import security
from sqlbroker.storage.base import TenantRole
from sqlbroker.storage.sql import load_blocks, load_migrations

ACME, GLOBEX = "ten_acme_login", "ten_globex_login"


class Tenants:
    def __init__(self, cluster: Any, name: str) -> None:
        self.cluster, self.name = cluster, name
        self.admin_url = str(cluster.url(name))

    def url(self, login: str) -> str:
        return self.admin_url.replace(f"//{self.cluster.server.superuser}@", f"//{login}@", 1)

    def broker(self, login: str, **options: Any) -> sqlbroker.Broker:
        return sqlbroker.Broker(self.url(login), **options)


@pytest.fixture
def tenants(pg_server: Any) -> Iterator[Tenants]:
    name = pg_server.take_clone()
    db = Tenants(pg_server, name)
    try:
        with sqlbroker.Broker(db.admin_url) as admin:
            security.grant_roles(admin.backend, create=True)
            groups = ", ".join(
                quote_ident(role)
                for group, role in security.role_names().items()
                if group != "migrator"
            )
            for login in (ACME, GLOBEX):
                pg_server.execute(
                    f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{login}')"
                    f" THEN CREATE ROLE {quote_ident(login)} LOGIN IN ROLE {groups}; END IF; END $$"
                )
            security.set_tenant_role(admin.backend, tenant="acme", role=ACME)
            security.set_tenant_role(admin.backend, tenant="globex", role=GLOBEX)
            security.enable_tenants(admin.backend)
            assert security.tenants_enabled(admin.backend)
        yield db
    finally:
        pg_server.drop_later(name)


@pytest.mark.postgres
def test_tenants_never_see_or_touch_each_others_messages(tenants: Tenants) -> None:
    with tenants.broker(ACME) as acme, tenants.broker(GLOBEX) as globex:
        acme.subscribe("acme-orders", ["orders.#"])
        globex.subscribe("globex-orders", ["orders.#"])
        acme.publish("orders.created", {"by": "acme"})
        globex.publish("orders.created", {"by": "globex"})
        acme.send("acme-jobs", "secret-1", idempotency_key="same-key")
        acme.send("acme-jobs", "secret-2")

        assert {s.name for s in acme.subscriptions()} == {"acme-orders", "acme-jobs"}
        assert {s.name for s in globex.subscriptions()} == {"globex-orders"}
        assert {s.subscription for s in globex.stats()} == {"globex-orders"}
        assert globex.pending("acme-jobs") == []
        assert globex.claim("acme-jobs") == []
        assert globex.claim("acme-orders") == []
        (mine,) = globex.claim("globex-orders")
        assert mine.payload == {"by": "globex"}
        globex.complete(mine)

        # A lease from the other tenant is no lease at all.
        stolen = acme.claim("acme-jobs")[0]
        with pytest.raises(sqlbroker.LeaseLost):
            globex.complete(stolen)
        assert not globex.backend.message_extend_leases(leases=[Lease.of(stolen)], lease=60)
        acme.dead_letter(stolen, reason="acme only")

        # Dead letters and the archive: neither listed, counted, replayed nor purged.
        assert globex.dead_letters.list() == []
        assert globex.dead_letters.replay(subscription="acme-jobs", actor="globex") == []
        assert globex.dead_letters.purge(subscription="acme-jobs", actor="globex") == 0
        assert [d.payload for d in acme.dead_letters.list()] == ["secret-1"]
        assert all(row.subscription == "globex-orders" for row in globex.archive())
        assert globex.dead_letters.replay(subscription="acme-jobs", actor="x") == []

        # Writing into the other tenant's queue is refused, not silently routed.
        with pytest.raises(sqlbroker.StorageError, match="row-level security"):
            globex.send("acme-jobs", "intruder")
        assert sorted(d.payload for d in acme.claim("acme-jobs", limit=10)) == ["secret-2"]
        assert acme.backend.tenant_list() == [TenantRole(role=ACME, tenant="acme")]


@pytest.mark.postgres
def test_stored_results_are_the_tenants_own(tenants: Tenants) -> None:
    with tenants.broker(ACME) as acme, tenants.broker(GLOBEX) as globex:
        message_id = acme.send("acme-calc", 1)
        (delivery,) = acme.claim("acme-calc")
        acme.complete(delivery, result={"secret": 42})
        found = acme.result(message_id)
        assert found is not None
        assert found.value == {"secret": 42}
        with pytest.raises(sqlbroker.NotFound):
            globex.result(message_id)
        with psycopg.connect(tenants.url(GLOBEX)) as conn:
            (row,) = conn.execute("SELECT count(*) FROM sqlbroker_result").fetchall()
            assert row[0] == 0, "the tenant's own SQL sees no other tenant's result"


@pytest.mark.postgres
def test_the_tenants_own_sql_cannot_cross_the_boundary(tenants: Tenants) -> None:
    with tenants.broker(ACME) as acme:
        acme.send("acme-jobs", "payload of acme")
    with psycopg.connect(tenants.url(GLOBEX), autocommit=True) as conn:
        count = "SELECT count(*) FROM sqlbroker_message"
        assert conn.execute(count).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM sqlbroker_subscription").fetchone() == (0,)
        # A stand-in mapping table in pg_temp (searched first) changes nothing.
        conn.execute("CREATE TEMP TABLE sqlbroker_tenant (login_role text, tenant text)")
        conn.execute("INSERT INTO sqlbroker_tenant VALUES (session_user, 'acme')")
        conn.execute("SET search_path = pg_temp, public")
        assert conn.execute(count).fetchone() == (0,)
        conn.execute("RESET search_path")
        # Acting as a group role leaves session_user, and so the tenant, as it was.
        conn.execute("SET ROLE sqlbroker_consumer")
        assert conn.execute(count).fetchone() == (0,)
        conn.execute("RESET ROLE")
        # Settings are not the binding.
        conn.execute("SELECT set_config('sqlbroker.tenant', 'acme', false)")
        assert conn.execute(count).fetchone() == (0,)
        for attack in (
            "UPDATE public.sqlbroker_tenant SET tenant = 'acme'",
            "INSERT INTO public.sqlbroker_tenant VALUES ('ten_globex_login', 'acme')",
            "UPDATE sqlbroker_subscription SET tenant = 'globex'",
            "DELETE FROM sqlbroker_message",
            "ALTER TABLE sqlbroker_message DISABLE ROW LEVEL SECURITY",
        ):
            try:
                with conn.transaction():
                    conn.execute(attack)
            except psycopg.errors.InsufficientPrivilege:
                continue
    with tenants.broker(ACME) as acme:
        assert [d.payload for d in acme.claim("acme-jobs")] == ["payload of acme"]
    with psycopg.connect(tenants.admin_url) as admin:
        rows = admin.execute(
            "SELECT login_role, tenant FROM sqlbroker_tenant ORDER BY 1"
        ).fetchall()
    assert rows == [(ACME, "acme"), (GLOBEX, "globex")]


@pytest.mark.postgres
def test_idempotency_keys_are_per_tenant(tenants: Tenants) -> None:
    with tenants.broker(ACME) as acme, tenants.broker(GLOBEX) as globex:
        subscribed = [acme.subscribe("acme-orders", ["orders.#"])]
        subscribed.append(globex.subscribe("globex-orders", ["orders.#"]))
        first = acme.publish("orders.paid", {"n": 1}, idempotency_key="order-1")
        other = globex.publish("orders.paid", {"n": 2}, idempotency_key="order-1")
        assert other != first  # neither a collision nor the other tenant's message id
        assert globex.publish("orders.paid", {"n": 2}, idempotency_key="order-1") == other
        with pytest.raises(sqlbroker.IdempotencyConflict):
            acme.publish("orders.paid", {"n": 3}, idempotency_key="order-1")
        assert [d.payload for d in acme.claim("acme-orders")] == [{"n": 1}]
        assert [d.payload for d in globex.claim("globex-orders")] == [{"n": 2}]


@pytest.mark.postgres
def test_claims_stay_index_driven_under_the_policies(tenants: Tenants) -> None:
    with tenants.broker(ACME) as acme:
        acme.send_many("acme-jobs", list(range(50)))
    with psycopg.connect(tenants.url(ACME)) as conn:
        conn.execute("SET enable_seqscan = off")  # the table is tiny; ask what the index gives
        with sqlbroker.Broker(tenants.url(ACME)) as acme:
            claim = acme.backend._sql["message_claim"]  # type: ignore[attr-defined]
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                b"EXPLAIN " + claim.encode(),
                {"subscription": "acme-jobs", "now": None, "lease": 30, "limit": 10}
                | {"worker": None, "max_attempts": None, "claim_commit": "off"},
            )
        )
    assert "sqlbroker_message_claim" in plan, plan
    assert "Seq Scan on sqlbroker_message" not in plan, plan


@pytest.mark.postgres
def test_disabling_tenants_lifts_the_policies(tenants: Tenants) -> None:
    with tenants.broker(ACME) as acme:
        acme.send("acme-jobs", 1)
    with sqlbroker.Broker(tenants.admin_url) as admin:
        security.disable_tenants(admin.backend)
        assert not security.tenants_enabled(admin.backend)
    with tenants.broker(GLOBEX) as globex:
        assert [s.subscription for s in globex.stats()] == ["acme-jobs"]


@pytest.mark.postgres
def test_a_subscription_can_be_handed_to_a_tenant(tenants: Tenants) -> None:
    with sqlbroker.Broker(tenants.admin_url) as admin:
        admin.send("legacy", "from before tenants")
        assert security.assign_subscription(admin.backend, subscription="legacy", tenant="acme")
        assert not security.assign_subscription(admin.backend, subscription="nope", tenant="a")
        with pytest.raises(sqlbroker.NotFound):
            security.set_tenant_role(admin.backend, tenant="acme", role="no_such_role")
        with pytest.raises(sqlbroker.InvalidOption):
            security.set_tenant_role(admin.backend, tenant="acme corp", role=ACME)
    with tenants.broker(GLOBEX) as globex:
        assert globex.claim("legacy") == []
    with tenants.broker(ACME) as acme:
        assert [d.payload for d in acme.claim("legacy")] == ["from before tenants"]


def test_sqlite_refuses_tenants_and_roles_clearly(tmp_path: Path) -> None:
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/t.db") as broker:
        backend = broker.backend
        for operation in (
            lambda: security.enable_tenants(backend),
            lambda: security.set_tenant_role(backend, tenant="acme", role="x"),
            lambda: security.tenants(backend),
            lambda: security.grant_roles(backend),
        ):
            with pytest.raises(sqlbroker.ConfigurationError, match="PostgreSQL"):
                operation()
        assert not security.tenants_enabled(backend)


def test_a_tenant_name_is_one_topic_segment(tmp_path: Path) -> None:
    """A tenant's name follows the rule of a topic's segment, character for character and
    in its length: SQLite checks the name first, then refuses the operation."""
    names = [chr(code) for code in range(0x300)] + ["\u0663", "\u212a", "\u017f", "\ud800"]
    names += ["", "a.b", "x" * 64, "x" * 65]

    def tenant_accepts(name: str) -> bool:
        try:
            security.set_tenant_role(backend, tenant=name, role="x")
        except sqlbroker.ConfigurationError:
            return True
        except sqlbroker.InvalidOption:
            return False
        raise AssertionError("SQLite refuses every tenant operation")

    def segment_accepts(name: str) -> bool:
        try:
            return "." not in validate_topic(name)
        except sqlbroker.InvalidName:
            return False

    with sqlbroker.Broker(f"sqlite:///{tmp_path}/t.db") as broker:
        backend = broker.backend
        accepted = [name for name in names if tenant_accepts(name)]
        assert accepted == [name for name in names if segment_accepts(name)]
    assert len(accepted) == 64 + 1  # letters, digits, '_', '-', and the longest name


@pytest.mark.parametrize("role", ["", "a\x00b", "\ud800", "bad\nrole", "x" * 64])
def test_a_role_name_that_postgresql_cannot_hold_is_a_validation_error(
    tmp_path: Path, role: str
) -> None:
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/t.db") as broker:
        with pytest.raises(sqlbroker.InvalidOption, match="role"):
            security.set_tenant_role(broker.backend, tenant="acme", role=role)
        with pytest.raises(sqlbroker.InvalidOption, match="role"):
            security.remove_tenant_role(broker.backend, role=role)


@pytest.mark.postgres
def test_schema_9_keeps_a_moving_saga_with_its_tenant(pg_server: Any) -> None:
    """A database that had tenants before schema 9: the sagas still moving take the tenant
    of the queue their awaited message waits in, so their tenant's workers still see them."""
    name = pg_server.create_database(f"sqlbroker_v8_{uuid.uuid4().hex[:12]}")
    url = str(pg_server.url(name))
    package = "sqlbroker.storage.postgres"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(load_blocks(package, "queries.sql")["schema_version_table"].encode())
            for version, title, script in load_migrations(f"{package}.migrations"):
                if version > 8:
                    break
                conn.execute(script.encode())
                conn.execute(
                    "INSERT INTO sqlbroker_schema_version (version, name) VALUES (%s, %s)",
                    (version, title),
                )
            waiting = uuid.uuid4()
            conn.execute(
                "INSERT INTO sqlbroker_subscription (name, created_at, tenant)"
                " VALUES ('acme-saga', now(), 'acme')"
            )
            conn.execute(
                "INSERT INTO sqlbroker_message (message_id, subscription, topic, state,"
                " priority, payload, content_type, max_attempts, enqueued_at, available_at,"
                " tenant) VALUES (%s, 'acme-saga', 'acme-saga', 'available', 2, '\\x31',"
                " 'application/json', 5, now(), now(), 'acme')",
                (waiting,),
            )
            for saga_id, status in (("moving", "running"), ("done", "completed")):
                conn.execute(
                    "INSERT INTO sqlbroker_saga (id, name, status, data, step, version,"
                    " message_id, timeout, created_at, updated_at)"
                    " VALUES (%s, 'ship', %s, '{}', 0, 1, %s, 60, now(), now())",
                    (saga_id, status, waiting),
                )
        with sqlbroker.Broker(url, migrate=False) as broker:
            assert broker.migrate()[:1] == [9]
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT id, tenant FROM sqlbroker_saga ORDER BY id").fetchall()
        assert rows == [("done", ""), ("moving", "acme")]
    finally:
        pg_server.drop_database(name)


@pytest.mark.postgres
def test_rows_the_owner_settles_for_a_tenant_are_the_tenants(tenants: Tenants) -> None:
    """The owner (administration) settles a tenant's messages: the dead letter and the
    archive row take the subscription's tenant, not the owner's (none), so the tenant
    still sees them."""
    with tenants.broker(ACME) as acme:
        acme.send("acme-jobs", "to be dead-lettered")
        kept = acme.send("acme-jobs", "to be cancelled", delay=3600)
    with sqlbroker.Broker(tenants.admin_url) as owner:
        owner.dead_letter(owner.claim("acme-jobs")[0], reason="by the owner")
        assert owner.cancel(kept) == 1
    with tenants.broker(ACME) as acme:
        assert [d.reason for d in acme.dead_letters.list()] == ["by the owner"]
        assert [(row.payload, row.outcome.value) for row in acme.archive()] == [
            ("to be cancelled", "cancelled")
        ]
    with tenants.broker(GLOBEX) as globex:
        assert globex.dead_letters.list() == []
        assert globex.archive() == []


def _migrated_to(conn: psycopg.Connection[Any], last: int) -> None:
    package = "sqlbroker.storage.postgres"
    conn.execute(load_blocks(package, "queries.sql")["schema_version_table"].encode())
    for version, title, script in load_migrations(f"{package}.migrations"):
        if version > last:
            break
        conn.execute(script.encode())
        conn.execute(
            "INSERT INTO sqlbroker_schema_version (version, name) VALUES (%s, %s)",
            (version, title),
        )


_DEAD = (
    "INSERT INTO sqlbroker_dead (delivery_id, message_id, subscription, topic, priority,"
    " payload, content_type, attempts, max_attempts, replay_count, reason, enqueued_at,"
    " first_failed_at, last_failed_at, dead_at) VALUES (1, gen_random_uuid(), %(name)s,"
    " %(name)s, 2, '\\x31', 'application/json', 5, 5, 0, 'failed', %(at)s, %(at)s, %(at)s,"
    " %(at)s)"
)
_ARCHIVE = (
    "INSERT INTO sqlbroker_archive (message_id, subscription, topic, outcome, priority,"
    " payload, content_type, attempts, max_attempts, replay_count, enqueued_at, finished_at,"
    " tenant) VALUES (gen_random_uuid(), %(name)s, %(name)s, 'completed', 2, '\\x31',"
    " 'application/json', 1, 5, 0, %(at)s, %(at)s, %(tenant)s)"
)


@pytest.mark.postgres
def test_schema_11_gives_leftovers_their_tenant(pg_server: Any) -> None:
    """A database from before schema 11: rows written since their subscription was created
    take its tenant; leftovers of an earlier holder of the name do not go to the new one."""
    name = pg_server.create_database(f"sqlbroker_v10_{uuid.uuid4().hex[:12]}")
    url = str(pg_server.url(name))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrated_to(conn, 10)
            # 'reused' was globex's, deleted an hour ago, and is acme's since; 'gone' is
            # deleted and nobody's; 'kept' is acme's from before tenants (assigned later).
            conn.execute(
                "INSERT INTO sqlbroker_subscription (name, created_at, tenant) VALUES"
                " ('reused', now() - interval '1 minute', 'acme'),"
                " ('kept', now() - interval '1 minute', 'acme')"
            )
            old, new = "now() - interval '1 hour'", "now()"
            for subscription, at, tenant in (
                ("reused", old, "globex"),
                ("reused", new, "acme"),
                ("gone", old, None),
                ("kept", new, None),
            ):
                params = {"name": subscription, "tenant": tenant}
                conn.execute(_DEAD.replace("%(at)s", at).encode(), params)
                conn.execute(_ARCHIVE.replace("%(at)s", at).encode(), params)
                conn.execute(
                    "INSERT INTO sqlbroker_metric_minute (subscription, minute, worker,"
                    " completed, retried, dead, handler_count, handler_seconds,"
                    f" handler_buckets) VALUES (%s, date_trunc('minute', {at}), 'w', 1, 0, 0,"
                    " 1, 0.1, '[]')",
                    (subscription,),
                )
            conn.execute(
                "INSERT INTO sqlbroker_metric_total (subscription, outcome, count)"
                " VALUES ('reused', 'completed', 2), ('gone', 'completed', 3)"
            )
        with sqlbroker.Broker(url, migrate=False) as broker:
            assert broker.migrate()[:1] == [11]
        with psycopg.connect(url) as conn:

            def owners(table: str, time: str) -> list[tuple[Any, ...]]:
                return conn.execute(
                    f"SELECT subscription, {time} < now() - interval '30 minutes', tenant"
                    f" FROM {table} ORDER BY 1, 2"
                ).fetchall()

            assert owners("sqlbroker_dead", "dead_at") == [
                ("gone", True, None),
                ("kept", False, "acme"),
                ("reused", False, "acme"),
                ("reused", True, None),
            ]
            assert owners("sqlbroker_archive", "finished_at") == [
                ("gone", True, None),
                ("kept", False, "acme"),
                ("reused", False, "acme"),
                ("reused", True, "globex"),
            ]
            assert owners("sqlbroker_metric_minute", "minute") == [
                ("gone", True, ""),
                ("kept", False, "acme"),
                ("reused", False, "acme"),
                ("reused", True, ""),
            ]
            totals = "SELECT subscription, tenant FROM sqlbroker_metric_total ORDER BY 1"
            assert conn.execute(totals).fetchall() == [("gone", ""), ("reused", "acme")]
    finally:
        pg_server.drop_database(name)


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # started before its worker runs
@pytest.mark.postgres
def test_a_tenants_worker_runs_its_sagas_schedules_and_heartbeats(tenants: Tenants) -> None:
    """Isolation leaves a tenant's own work whole: a saga runs to its end, a schedule fires
    into the tenant's subscription, once() and the heartbeat work, under the policies."""
    saga = sqlbroker.Saga("ship", [sqlbroker.Step("pack"), sqlbroker.Step("send")], timeout=600)
    app = sqlbroker.app.Broker(tenants.url(ACME), lease=30)
    charged: list[int] = []

    @app.saga_step(saga, "pack")
    def pack(message: Any) -> dict[str, bool]:
        with app.once("charge", "order-1") as first:
            if first:
                charged.append(1)
        return {"packed": True}

    @app.saga_step(saga, "send")
    def send(message: Any) -> dict[str, bool]:
        return {"sent": True}

    try:
        app.subscribe("acme-ticks", ["acme.tick"])
        app.schedule("tick", "acme.tick", {"n": 1}, every=3600)
        app.sagas.start(saga, {"order": 1}, saga_id="acme-saga")
        app.run_until_idle(timeout=60)
        assert app.sagas.get("acme-saga").status.value == "completed"
        assert charged == [1]
        assert [w.name for w in app.workers()] == [app.worker_name()]
        assert [s.name for s in app.schedules()] == ["tick"]
    finally:
        app.close()
    with tenants.broker(GLOBEX) as globex:
        assert globex.workers() == []
        assert globex.schedules() == []
        assert globex.sagas.list() == []


@pytest.mark.postgres
def test_an_upgrade_with_tenants_enabled_isolates_the_tables_schema_9_adds(
    pg_server: Any,
) -> None:
    """Tenants enabled before schema 9: the tables schema 9 puts under tenant policies are
    isolated by the upgrade itself, their tenant defaulting to the writer's, not left open
    until `tenants enable` runs again."""
    name = pg_server.create_database(f"sqlbroker_v8_{uuid.uuid4().hex[:12]}")
    url = str(pg_server.url(name))
    added = ["schedule", "processed", "worker", "saga", "saga_step", "audit", "spark_stage"]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrated_to(conn, 8)
            conn.execute("ALTER TABLE sqlbroker_message ENABLE ROW LEVEL SECURITY")
        with sqlbroker.Broker(url, migrate=False) as broker:
            broker.migrate()
        with psycopg.connect(url) as conn:
            isolated = dict(
                conn.execute(
                    "SELECT relname, relrowsecurity FROM pg_class"
                    " WHERE relname = ANY(%s) AND relkind = 'r'",
                    ([f"sqlbroker_{table}" for table in added],),
                ).fetchall()
            )
            assert isolated == {f"sqlbroker_{table}": True for table in added}
            defaults = conn.execute(
                "SELECT table_name, column_default FROM information_schema.columns"
                " WHERE column_name = 'tenant' AND table_name = ANY(%s)",
                ([f"sqlbroker_{table}" for table in added if table != "saga_step"],),
            ).fetchall()
            assert len(defaults) == len(added) - 1
            assert all("sqlbroker_session_tenant" in default for _, default in defaults)
    finally:
        pg_server.drop_database(name)


@pytest.mark.postgres
def test_a_tenants_reaper_applies_its_retention_to_its_own_rows_only(tenants: Tenants) -> None:
    """Retention under row security: acme's reaper, with a clock far ahead, deletes acme's
    own archive rows and dead letters past their time, keeps globex's, and drops no day
    that still holds a row (a day of the archive holds every tenant's rows). The owner's
    reaper then drops the day."""
    clock = sqlbroker.ManualClock()
    with tenants.broker(ACME) as acme, tenants.broker(GLOBEX) as globex:
        for broker, queue in ((acme, "acme-jobs"), (globex, "globex-jobs")):
            broker.send(queue, "done")
            broker.complete(broker.claim(queue))
            broker.send(queue, "dead")
            broker.dead_letter(broker.claim(queue)[0], reason="bad")
    clock.advance(timedelta(days=40))
    with tenants.broker(ACME, clock=clock) as acme:
        counts = acme.reap()
        assert (counts["archive_trimmed"], counts["dead_trimmed"]) == (1, 1)
        assert acme.archive() == []
    with tenants.broker(GLOBEX) as globex:
        assert [row.payload for row in globex.archive()] == ["done"]
        assert [d.payload for d in globex.dead_letters.list()] == ["dead"]
    with sqlbroker.Broker(tenants.admin_url, clock=clock) as owner:
        owner.reap()
        assert owner.archive() == []
        assert owner.dead_letters.list() == []


@pytest.mark.postgres
def test_flow_limits_and_their_buckets_stay_with_their_tenant(tenants: Tenants) -> None:
    """A tenant's rate limit charges a bucket no other tenant sees or changes, and its
    capped claims count only its own running copies (docs/flow-control.md)."""
    with tenants.broker(ACME) as acme, tenants.broker(GLOBEX) as globex:
        acme.send("acme-jobs", 1)
        acme.send("acme-jobs", 2)
        globex.send("globex-jobs", 1)
        acme.set_flow("acme-jobs", rate_limit="1/hour", max_running=5)
        assert len(acme.claim("acme-jobs", limit=10)) == 1
        assert acme.claim("acme-jobs", limit=10) == []
        with pytest.raises(sqlbroker.NotFound):
            globex.set_flow("acme-jobs", rate_limit=None)
        assert globex.flow() == [globex.flow("globex-jobs")[0]]
    with psycopg.connect(tenants.url(GLOBEX), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM sqlbroker_flow_bucket").fetchone() == (0,)
        done = conn.execute("UPDATE sqlbroker_flow_bucket SET tat = now() + interval '1 day'")
        assert done.rowcount == 0
    with psycopg.connect(tenants.url(ACME), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM sqlbroker_flow_bucket").fetchone() == (1,)


@pytest.mark.postgres
def test_a_handed_over_subscription_takes_its_results_along(tenants: Tenants) -> None:
    """Assigning a queue to a tenant moves its stored results (``broker.result``) and the
    Celery results of its tasks: the new tenant reads them, another tenant does not."""
    from celery import Celery

    from sqlbroker.contrib.celery import SCHEME

    def celery_app(url: str) -> Celery:
        return Celery("shop", broker=f"{SCHEME}+{url}", backend=f"{SCHEME}+{url}")

    with sqlbroker.Broker(tenants.admin_url) as admin, celery_app(tenants.admin_url) as app:
        message_id = admin.send("legacy", "plain")
        (plain,) = admin.claim("legacy")
        admin.complete(plain, result={"plain": 1})
        task = app.send_task("shop.add", (1, 2), queue="legacy")
        (celery_message,) = admin.claim("legacy")
        app.backend.mark_as_done(task.id, 3)
        admin.complete(celery_message)  # archived: the task id is still known
        waiting = app.send_task("shop.add", (3, 4), queue="legacy")
        app.backend.mark_as_done(waiting.id, 7)  # the task still in the queue
        other = app.send_task("shop.add", (5, 6), queue="elsewhere")
        app.backend.mark_as_done(other.id, 11)
        assert security.assign_subscription(admin.backend, subscription="legacy", tenant="acme")

    with tenants.broker(ACME) as acme, celery_app(tenants.url(ACME)) as acme_app:
        found = acme.result(message_id)
        assert found is not None
        assert found.value == {"plain": 1}
        assert acme_app.AsyncResult(task.id).get(timeout=10) == 3
        assert acme_app.AsyncResult(waiting.id).get(timeout=10) == 7
        assert acme_app.AsyncResult(other.id).status == "PENDING", "not the queue's"
    with tenants.broker(GLOBEX) as globex, celery_app(tenants.url(GLOBEX)) as globex_app:
        with pytest.raises(sqlbroker.NotFound):
            globex.result(message_id)
        assert globex_app.AsyncResult(task.id).status == "PENDING"
        assert globex_app.AsyncResult(waiting.id).status == "PENDING"


@pytest.mark.postgres
def test_a_handed_over_subscription_takes_its_groups_and_chord_counters_along(
    tenants: Tenants,
) -> None:
    """Assigning a queue to a tenant moves the group results and chord counters of the
    groups its Celery tasks belong to (Celery keeps them beside the task results); another
    queue's group stays, and another tenant sees none of them."""
    from celery import Celery

    from sqlbroker.contrib.celery import SCHEME

    def celery_app(url: str) -> Celery:
        return Celery("shop", broker=f"{SCHEME}+{url}", backend=f"{SCHEME}+{url}")

    def group_of(app: Celery, queue: str) -> str:
        group_id = str(uuid.uuid4())
        parts = [app.send_task("shop.add", (n, n), queue=queue, group_id=group_id) for n in (1, 2)]
        app.GroupResult(group_id, parts).save()
        app.backend.incr(app.backend.get_key_for_chord(group_id))  # one part finished
        return group_id

    with celery_app(tenants.admin_url) as app:
        moved, stayed = group_of(app, "legacy"), group_of(app, "elsewhere")
        with sqlbroker.Broker(tenants.admin_url) as admin:
            admin.claim("legacy")  # running, archived or dead: the same
            assert security.assign_subscription(admin.backend, subscription="legacy", tenant="acme")

    with celery_app(tenants.url(ACME)) as acme_app:
        restored = acme_app.GroupResult.restore(moved)
        assert restored is not None
        assert len(restored.results) == 2
        assert acme_app.backend.incr(acme_app.backend.get_key_for_chord(moved)) == 2
        assert acme_app.GroupResult.restore(stayed) is None
    with celery_app(tenants.url(GLOBEX)) as globex_app:
        assert globex_app.GroupResult.restore(moved) is None
        assert globex_app.backend.get(globex_app.backend.get_key_for_chord(moved)) is None
