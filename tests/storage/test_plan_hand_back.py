"""A statement that fails alone on one of PostgreSQL's pooled autocommit connections is
handed back to its plan (plan.StatementFailed): the statements before it committed, and a
plan may carry on; uncaught, it goes on with the driver's error (the backend translates it,
and does not claim that nothing was changed when statements before it committed).
Inside a transaction nothing is handed back. The operation that relies on it, a keyed
settle whose promotion fails: tests/seam/test_settle.py."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from tests.seam.support import claim, publish

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import DatabaseBusy
from sqlbroker.core.sagas import NewSaga
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.storage.factory import open_backend
from sqlbroker.storage.plan import Plan, StatementFailed, query
from sqlbroker.storage.postgres import dialect
from sqlbroker.storage.postgres.liveness import sound

SQL = {
    "write": b"INSERT INTO written VALUES (%(n)s)",
    "fail": b"SELECT 1 / 0",
}


def carries_on() -> Plan[str]:
    yield query("write", n=1)
    try:
        yield query("fail")
    except StatementFailed as failed:
        yield query("write", n=2)
        return str(failed)
    return "not failed"


def gives_up(*, write_first: bool = True) -> Plan[None]:
    if write_first:
        yield query("write", n=1)
    yield query("fail")


def _written(conn: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in conn.execute("SELECT n FROM written ORDER BY n")]


@pytest.fixture
def conn(pg_url: str) -> Any:
    with psycopg.connect(pg_url, autocommit=True) as opened:
        opened.execute("CREATE TEMP TABLE written (n int)")
        yield opened


def test_a_failure_alone_is_handed_to_the_plan_which_may_carry_on(conn: Any) -> None:
    assert dialect.run(conn, SQL, carries_on(), None, pooled=True) == "division by zero"
    assert _written(conn) == [1, 2]


def test_uncaught_it_goes_on_with_the_drivers_error_and_what_came_before_stays(
    conn: Any,
) -> None:
    """It tells whether statements of the plan ran (and committed) before it."""
    with pytest.raises(StatementFailed) as failed:
        dialect.run(conn, SQL, gives_up(), None, pooled=True)
    assert isinstance(failed.value.error, psycopg.errors.DivisionByZero)
    assert failed.value.committed
    assert _written(conn) == [1]
    with pytest.raises(StatementFailed) as failed:
        dialect.run(conn, SQL, gives_up(write_first=False), None, pooled=True)
    assert not failed.value.committed


def test_in_a_transaction_nothing_is_handed_back(conn: Any) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
        dialect.run(conn, SQL, carries_on(), None)
    assert _written(conn) == []


def test_the_async_runner_hands_it_back_too(pg_url: str) -> None:
    async def scenario() -> tuple[str, list[int]]:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute("CREATE TEMP TABLE written (n int)")
            done = await dialect.run_async(conn, SQL, carries_on(), None, pooled=True)
            cursor = await conn.execute("SELECT n FROM written ORDER BY n")
            return done, [row[0] for row in await cursor.fetchall()]

    assert asyncio.run(scenario()) == ("division by zero", [1, 2])


APP = "sqlbroker-hand-back-under-test"


def _end_sessions(admin: psycopg.Connection[Any], *, but: int = 0) -> None:
    """Terminate the backend's sessions of this moment but the one of pid ``but``, and
    wait until they have ended (``pg_terminate_backend`` only signals). Sessions the pool
    opens meanwhile to replace them are left alone: waiting for none at all could wait
    for ever."""
    pids = [
        row[0]
        for row in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s AND pid <> %s",
            (APP, but),
        )
    ]
    admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
    while admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
    ).fetchone() != (0,):
        time.sleep(0.01)


def _drop_the_promotion(admin_url: str) -> None:
    """Once the backend's promotion waits for the locked copy, end every session of the
    backend: its idle ones first, then the waiting one."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        while (
            waiting := admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s AND wait_event_type = 'Lock'",
                (APP,),
            ).fetchone()
        ) is None:
            time.sleep(0.01)
        _end_sessions(admin, but=waiting[0])
        _end_sessions(admin)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_dropped_connection_a_plan_carried_on_past_has_the_pool_check_its_idle_ones(
    pg_url: str, pg_server: Any, face: str
) -> None:
    """A keyed settle commits its complete, then its promotion of the key's next copy
    waits for a lock while the server ends every session of the pool (a restart,
    ``pg_terminate_backend``). The settle carries on past the dropped connection (the
    hand-back), and the pool, as after any lost connection, tests its idle connections
    at once: the dead ones are gone before the next call (it used to learn of them only
    from a connection that reached it as ``ConnectionLost``)."""
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    # Timeouts far away: only the terminated session may end the promotion's wait.
    backend = open_backend(pg_url, application_name=APP, network_timeout=600, clock=ManualClock())
    try:
        second = publish(backend, "jobs", 2, key="k")[1]
        (head,) = claim(backend, "jobs")
        settle = [Settlement.complete(Lease.of(head))]
        with psycopg.connect(admin_url) as holder:
            holder.execute(
                "SELECT 1 FROM sqlbroker_message WHERE message_id = %s FOR UPDATE", (second,)
            )
            dropping = threading.Thread(target=_drop_the_promotion, args=(admin_url,))
            if face == "sync":
                with backend.begin(), backend.begin():  # two connections, then idle
                    pass
                dropping.start()
                done = backend.message_settle_many(settlements=settle)
                checked = backend._db._pool.get_stats().get("connections_lost", 0) > 0
            else:

                async def scenario() -> tuple[list[int], bool]:
                    async with backend.begin_async(), backend.begin_async():
                        pass
                    dropping.start()
                    try:
                        done = await backend.async_ops.message_settle_many(settlements=settle)
                        idle = backend._db._loop_pool()._idle
                        return done, all(sound(conn) for conn in idle)
                    finally:
                        await backend.close_async()

                done, checked = asyncio.run(scenario())
            dropping.join()
        assert done == [head.id]
        assert checked, "the pool did not test its idle connections"
    finally:
        backend.close()


@pytest.mark.parametrize("locked", ["sqlbroker_dead", "sqlbroker_archive"])
def test_a_later_statement_failing_uncaught_does_not_claim_nothing_was_changed(
    pg_url: str, pg_server: Any, locked: str
) -> None:
    """A lost-lease release runs its statements alone, each committing on its own: first
    the cancelled copies whose lease expired are archived, then the spent ones are
    dead-lettered. When the dead letter waits past ``lock_timeout`` (another session
    holds the dead letters' table), the archive has committed, and the ``DatabaseBusy``
    says so instead of "nothing was changed" (which it used to say). When the first
    statement is the one that waits (the archive is held), nothing was changed, as it
    says."""
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    clock = ManualClock()
    backend = open_backend(pg_url, lock_timeout=0.2, clock=clock)
    try:
        (message_id,) = publish(backend, "jobs", 1)
        claim(backend, "jobs")
        assert backend.message_cancel_many(message_ids=[message_id], actor="test") == 1
        clock.advance(60)  # past the lease
        with psycopg.connect(admin_url) as holder:
            holder.execute(f"LOCK TABLE {locked} IN SHARE MODE")
            with pytest.raises(DatabaseBusy, match="lock_timeout") as busy:
                backend.lease_release_expired(limit=10)
        archived = backend.archive_list(
            subscription="jobs", outcome=None, message_id=None, limit=10
        )
        if locked == "sqlbroker_dead":
            assert "nothing was changed" not in str(busy.value)
            assert "statements before it had committed" in str(busy.value)
            assert [row.outcome.value for row in archived] == ["cancelled"]
        else:
            assert "nothing was changed" in str(busy.value)
            assert archived == []
    finally:
        backend.close()


def test_a_read_whose_later_statement_fails_says_nothing_was_changed(
    pg_url: str, pg_server: Any
) -> None:
    """A read runs its statements alone too, but leaves nothing behind: a saga read whose
    steps wait past ``lock_timeout`` (another session holds their table) says nothing
    was changed, not that it may be partly done (which it used to say)."""
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    backend = open_backend(pg_url, lock_timeout=0.2)
    try:
        saga = NewSaga(id="s-1", name="order", data="{}", steps=(("reserve", True),), timeout=60)
        with backend.begin() as tx:
            assert tx.saga_insert(saga=saga)
        with psycopg.connect(admin_url) as holder:
            holder.execute("LOCK TABLE sqlbroker_saga_step IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(DatabaseBusy, match="lock_timeout") as busy:
                backend.saga_get(id="s-1")
        assert "nothing was changed, try again" in str(busy.value)
        assert "partly done" not in str(busy.value)
    finally:
        backend.close()


def test_a_write_that_reads_first_is_undone_whole(pg_url: str, pg_server: Any) -> None:
    """``tenant_set`` looks the role up, then maps it: one transaction, so a mapping that
    waits past ``lock_timeout`` says nothing was changed (it used to run the look alone,
    and then say the operation may be partly done)."""
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    backend = open_backend(pg_url, lock_timeout=0.2)
    try:
        backend.migrate()
        with psycopg.connect(admin_url) as holder:
            role = holder.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
            holder.execute("LOCK TABLE sqlbroker_tenant IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(DatabaseBusy, match="lock_timeout") as busy:
                backend.tenant_set(role=role, tenant="acme")
        assert "nothing was changed, try again" in str(busy.value)
        assert "partly done" not in str(busy.value)
    finally:
        backend.close()
