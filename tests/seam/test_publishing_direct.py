"""A single send on PostgreSQL's async pool goes straight through libpq (dialect.direct):
it stores what the cursor path stores, its driver errors reach the caller as sqlbroker
errors, and a cancelled send is stopped on the server and leaves no busy connection in
the pool."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from sqlbroker.core.errors import ConnectionLost, DatabaseBusy
from sqlbroker.storage.factory import open_backend

from .support import cancel_while_locked, new_message, publish

COLUMNS = (
    "subscription, topic, state, priority, idempotency_key, payload, content_type, headers,"
    " max_attempts, enqueued_at, available_at, expires_at"
)


def _stored(url: str, message_id: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            f"SELECT {COLUMNS} FROM sqlbroker_message WHERE message_id = %s", (message_id,)
        ).fetchone()
    assert row is not None
    *fields, enqueued, available, expires = row
    if available.year == 2030:  # absolute times
        return (*fields, available, expires)
    return (*fields, available - enqueued, expires and expires - enqueued)


async def _raised(awaitable: Awaitable[Any]) -> BaseException | None:
    """What awaiting ``awaitable`` raised, or None."""
    try:
        await awaitable
    except BaseException as error:
        return error
    return None


def _variants() -> list[dict[str, Any]]:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    return [
        {},
        {"priority": 7, "headers": '{"a": "b"}', "content_type": "text/plain"},
        {"delay": 30, "ttl": 3600.5},
        {"available_at": at, "expires_at": at + timedelta(days=1)},
        {"max_attempts": 1, "priority": 3},
    ]


def test_a_direct_send_stores_what_the_cursor_stores(pg_url: str) -> None:
    backend = open_backend(pg_url)
    try:
        publish(backend, "jobs", 2)
        publish(backend, "jobs")  # the queue is known: a send is one statement

        async def direct() -> list[str]:
            ids = []
            for fields in _variants():
                message = dataclasses.replace(new_message("jobs", {"f": str(fields)}), **fields)
                result = await backend.async_ops.message_insert_many(
                    messages=[message], subscription="jobs"
                )
                ids += result.message_ids
            return ids

        sync_ids = []
        for fields in _variants():
            message = dataclasses.replace(new_message("jobs", {"f": str(fields)}), **fields)
            sync_ids += backend.message_insert_many(
                messages=[message], subscription="jobs"
            ).message_ids
        direct_ids = asyncio.run(direct())
        assert [_stored(pg_url, i) for i in direct_ids] == [_stored(pg_url, i) for i in sync_ids]
    finally:
        backend.close()


def test_a_direct_send_error_is_a_sqlbroker_error_and_the_pool_goes_on(
    pg_url: str, pg_server: Any
) -> None:
    backend = open_backend(pg_url, lock_timeout=0.2)
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    try:
        publish(backend, "jobs", 2)
        publish(backend, "jobs")

        async def scenario() -> tuple[BaseException | None, list[str]]:
            send = backend.async_ops.message_insert_many
            await send(messages=[new_message("jobs")], subscription="jobs")  # prepared
            with psycopg.connect(admin_url) as admin:
                admin.execute("LOCK TABLE sqlbroker_message IN EXCLUSIVE MODE")
                refused = await _raised(send(messages=[new_message("jobs")], subscription="jobs"))
            after = await send(messages=[new_message("jobs")], subscription="jobs")
            return refused, after.message_ids

        refused, ids = asyncio.run(scenario())
        assert isinstance(refused, DatabaseBusy)
        assert not isinstance(refused, psycopg.Error)
        assert len(ids) == 1
    finally:
        backend.close()


def test_a_cancelled_direct_send_is_stopped_on_the_server(pg_url: str, pg_server: Any) -> None:
    # Timeouts far past the wait below: only the cancel request can end the statement.
    backend = open_backend(pg_url, lock_timeout=600, statement_timeout=1200, network_timeout=1800)
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    try:
        publish(backend, "jobs", 2)
        publish(backend, "jobs")
        cancelled = new_message("jobs")

        async def scenario() -> list[str]:
            send = backend.async_ops.message_insert_many
            await send(messages=[new_message("jobs")], subscription="jobs")  # prepared
            await cancel_while_locked(
                admin_url, lambda: send(messages=[cancelled], subscription="jobs")
            )
            after = await send(messages=[new_message("jobs")], subscription="jobs")
            return after.message_ids

        assert len(asyncio.run(scenario())) == 1
        with psycopg.connect(pg_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM sqlbroker_message WHERE message_id = %s",
                (cancelled.message_id,),
            ).fetchone()
        assert row == (0,)
    finally:
        backend.close()


def test_a_session_ended_under_a_direct_send_is_connection_lost(
    pg_url: str, pg_server: Any
) -> None:
    backend = open_backend(pg_url)
    admin_url = pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"])
    try:
        publish(backend, "jobs", 2)
        publish(backend, "jobs")

        async def scenario() -> tuple[BaseException | None, list[str]]:
            send = backend.async_ops.message_insert_many
            await send(messages=[new_message("jobs")], subscription="jobs")  # prepared
            with (
                psycopg.connect(admin_url) as locker,
                psycopg.connect(admin_url, autocommit=True) as admin,
            ):
                locker.execute("LOCK TABLE sqlbroker_message IN EXCLUSIVE MODE")
                task = asyncio.create_task(
                    send(messages=[new_message("jobs")], subscription="jobs")
                )
                ended = []
                while not ended:
                    await asyncio.sleep(0.01)
                    ended = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    ).fetchall()
                lost = await _raised(task)
            after = await send(messages=[new_message("jobs")], subscription="jobs")
            return lost, after.message_ids

        lost, ids = asyncio.run(scenario())
        assert isinstance(lost, ConnectionLost)
        assert len(ids) == 1
    finally:
        backend.close()


@pytest.mark.parametrize("pooler", [None, "transaction"])
def test_behind_a_transaction_pooler_a_send_prepares_nothing(
    pg_url: str, pooler: str | None
) -> None:
    # A transaction pooler may run the next statement on another server session, where a
    # statement prepared on this one does not exist (docs/reliability.md).
    backend = open_backend(pg_url, pooler=pooler, pool_size=1)
    try:
        publish(backend, "jobs", 2)
        publish(backend, "jobs")

        async def scenario() -> list[str]:
            send = backend.async_ops.message_insert_many
            for _ in range(2):
                await send(messages=[new_message("jobs")], subscription="jobs")
            async with backend.begin_async() as tx:  # the same (only) connection
                cursor = await tx.connection.execute(
                    "SELECT name FROM pg_prepared_statements WHERE name LIKE 'sqlbroker%'"
                )
                return [row[0] for row in await cursor.fetchall()]

        assert asyncio.run(scenario()) == ([] if pooler else ["sqlbroker_0"])
    finally:
        backend.close()


def test_a_connection_used_by_the_direct_path_is_freed_once_dropped(pg_url: str) -> None:
    """What the direct path keeps per connection (its adapters, its prepared statements)
    goes with the connection: the pool replaces connections (``max_lifetime``, reconnects),
    and a worker runs for weeks."""
    import gc
    import weakref

    from sqlbroker.storage.postgres.dialect import direct

    async def run() -> weakref.ref[Any]:
        conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        rows = await direct(conn, b"SELECT %(n)s::int", {"n": 7})
        assert list(rows) == [(7,)]
        await conn.close()
        return weakref.ref(conn)

    gone = asyncio.run(run())
    gc.collect()
    assert gone() is None
