"""The outbox through every kind of caller connection: the driver's own (in each transaction
mode), SQLAlchemy's Connection and Session, and asyncio connections — on both backends.

The rule is the same everywhere: the publish joins the caller's transaction and never
commits or rolls it back; with no transaction open on an autocommit connection it commits
as one unit of its own; a publish that fails leaves the caller's transaction as it was."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sqlbroker

APP_TABLE = "CREATE TABLE IF NOT EXISTS app_orders (id integer)"


@pytest.fixture
def ready(make_broker: Any, backend_url: str, request: pytest.FixtureRequest) -> sqlbroker.Broker:
    options = {"busy_timeout": 2} if backend_url.startswith("sqlite") else {}
    broker: sqlbroker.Broker = make_broker(**options)
    broker.subscribe("sub", "orders.#")
    if backend_url.startswith("sqlite"):
        with _driver(backend_url, autocommit=True) as conn:
            conn.execute(APP_TABLE)
        return broker
    # The application's table is the application's: created by the superuser, so that the
    # suite also runs as a runtime login, which may not create tables.
    import psycopg

    cluster = request.getfixturevalue("pg_server")
    dbname = psycopg.conninfo.conninfo_to_dict(backend_url)["dbname"]
    with psycopg.connect(cluster.url(str(dbname)), autocommit=True) as conn:
        conn.execute(APP_TABLE)
        conn.execute("GRANT ALL ON app_orders TO PUBLIC")
    return broker


def _driver(backend_url: str, *, autocommit: bool) -> Any:
    if backend_url.startswith("sqlite"):
        path = backend_url.removeprefix("sqlite:///")
        return _closing(sqlite3.connect(path, isolation_level=None if autocommit else ""))
    import psycopg

    return psycopg.connect(backend_url, autocommit=autocommit)


class _closing:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def _only_postgresql(backend_url: str) -> str:
    if backend_url.startswith("sqlite"):
        pytest.skip("PostgreSQL only")
    return backend_url


def _only_sqlite(backend_url: str) -> None:
    if not backend_url.startswith("sqlite"):
        pytest.skip("SQLite only")


def _sqlalchemy_url(backend_url: str, *, asynchronous: bool = False) -> str:
    if backend_url.startswith("sqlite"):
        return backend_url
    return backend_url.replace("postgresql://", "postgresql+psycopg://", 1)


def _app_rows(broker: sqlbroker.Broker, backend_url: str) -> int:
    with _driver(backend_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM app_orders").fetchone()
    return int(row[0])


def _claimed(broker: sqlbroker.Broker) -> list[str]:
    return [d.message_id for d in broker.claim("sub", limit=100)]


# --- the driver's own connection, in each transaction mode -----------------------------------


def test_autocommit_connection_commits_the_publish_as_one_unit(
    ready: sqlbroker.Broker, backend_url: str
) -> None:
    with _driver(backend_url, autocommit=True) as conn:
        ids = ready.publish_many(
            [
                {"topic": "orders.a", "payload": 1, "key": "k", "idempotency_key": "i1"},
                {"topic": "orders.b", "payload": 2, "key": "k", "idempotency_key": "i2"},
            ],
            conn=conn,
        )
        if isinstance(conn, sqlite3.Connection):
            assert not conn.in_transaction
        else:
            from psycopg.pq import TransactionStatus

            assert conn.info.transaction_status == TransactionStatus.IDLE
    # Per-key order: only the head is claimable.
    assert _claimed(ready) == ids[:1]


def test_implicit_transaction_mode_leaves_the_commit_to_the_caller(
    ready: sqlbroker.Broker, backend_url: str
) -> None:
    """sqlite3's default mode and psycopg without autocommit begin a transaction at the
    first write; the publish is such a write, and the caller's commit or rollback decides."""
    with _driver(backend_url, autocommit=False) as conn:
        ready.publish("orders.dropped", 1, conn=conn)
        conn.rollback()
        kept = ready.publish("orders.kept", 2, conn=conn)
        conn.commit()
    assert _claimed(ready) == [kept]


def test_a_failed_publish_leaves_the_callers_transaction_usable(
    ready: sqlbroker.Broker, backend_url: str
) -> None:
    """An IdempotencyConflict in the middle of a batch undoes only the publish's own rows
    (the keys reserved before the conflict included): the caller's writes still commit."""
    original = ready.publish("orders.a", {"v": 1}, idempotency_key="taken")
    ready.claim("sub")
    with _driver(backend_url, autocommit=False) as conn:
        conn.execute("INSERT INTO app_orders VALUES (7)")
        with pytest.raises(sqlbroker.IdempotencyConflict):
            ready.publish_many(
                [
                    {"topic": "orders.b", "payload": 1, "idempotency_key": "fresh"},
                    {"topic": "orders.a", "payload": {"v": 2}, "idempotency_key": "taken"},
                ],
                conn=conn,
            )
        later = ready.publish("orders.c", 3, conn=conn)
        conn.commit()
    assert _app_rows(ready, backend_url) == 1
    assert _claimed(ready) == [later]
    # "fresh" was never reserved: it publishes anew.
    assert ready.publish("orders.b", 9, idempotency_key="fresh") != original


def test_a_failed_postgresql_transaction_is_refused(
    ready: sqlbroker.Broker, backend_url: str
) -> None:
    pg_url = _only_postgresql(backend_url)
    import psycopg

    with psycopg.connect(pg_url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(sqlbroker.ValidationError, match="failed transaction"):
            ready.publish("orders.a", 1, conn=conn)


def test_a_connection_to_another_sqlite_file_is_refused(
    make_broker: Any, tmp_path: Any, backend_url: str
) -> None:
    _only_sqlite(backend_url)
    broker = make_broker()
    other = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(sqlbroker.ValidationError, match="not to this broker"):
        broker.publish("orders.a", 1, conn=other)
    other.close()


# --- SQLAlchemy ------------------------------------------------------------------------------


@pytest.fixture
def engine(ready: sqlbroker.Broker, backend_url: str) -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(_sqlalchemy_url(backend_url))
    yield engine
    engine.dispose()


def test_sqlalchemy_connection_commits_and_rolls_back(
    ready: sqlbroker.Broker, engine: sqlalchemy.Engine, backend_url: str
) -> None:
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("INSERT INTO app_orders VALUES (1)"))
        kept = ready.publish("orders.kept", 1, conn=conn)
    with engine.connect() as conn:
        ready.publish("orders.dropped", 2, conn=conn)
        conn.rollback()
    with engine.connect() as conn:
        # No statement of SQLAlchemy's yet: the publish begins its transaction, so that
        # the commit below commits it.
        also = ready.publish("orders.also", 3, conn=conn)
        conn.commit()
    with engine.connect() as conn:
        ready.publish("orders.closed", 4, conn=conn)
        # Closed without a commit: SQLAlchemy rolls back.
    assert _app_rows(ready, backend_url) == 1
    assert _claimed(ready) == [kept, also]


def test_sqlalchemy_session_commits_and_rolls_back(
    ready: sqlbroker.Broker, engine: sqlalchemy.Engine
) -> None:
    with Session(engine) as session:
        session.execute(sqlalchemy.text("INSERT INTO app_orders VALUES (1)"))
        kept = ready.publish("orders.kept", 1, conn=session)
        session.commit()
    with Session(engine) as session:
        ready.publish("orders.dropped", 2, conn=session)
        session.rollback()
    assert _claimed(ready) == [kept]


# --- asyncio ---------------------------------------------------------------------------------


def test_psycopg_async_connection(ready: sqlbroker.Broker, backend_url: str) -> None:
    pg_url = _only_postgresql(backend_url)
    import psycopg

    async def scenario() -> list[str]:
        async with sqlbroker.AsyncBroker(pg_url) as broker:
            kept: list[str] = []
            async with await psycopg.AsyncConnection.connect(pg_url) as conn:
                kept.append(await broker.publish("orders.kept", 1, conn=conn))
                kept += await broker.publish_many(
                    [{"topic": "orders.many", "payload": 2, "idempotency_key": "m"}], conn=conn
                )
                await conn.commit()
                await broker.send("direct", 3, conn=conn)
                await conn.rollback()
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                kept.append(await broker.publish("orders.auto", 4, conn=conn))
            return kept

    kept = asyncio.run(scenario())
    assert _claimed(ready) == kept
    assert "direct" not in [s.name for s in ready.subscriptions()]


def test_sqlalchemy_async_session(ready: sqlbroker.Broker, backend_url: str) -> None:
    pg_url = _only_postgresql(backend_url)

    async def scenario() -> str:
        engine = create_async_engine(_sqlalchemy_url(pg_url))
        try:
            async with sqlbroker.AsyncBroker(pg_url) as broker:
                async with AsyncSession(engine) as session:
                    kept = await broker.publish("orders.kept", 1, conn=session)
                    await session.commit()
                async with AsyncSession(engine) as session:
                    await broker.publish("orders.dropped", 2, conn=session)
                    await session.rollback()
                async with engine.connect() as conn:
                    await broker.publish("orders.dropped", 3, conn=conn)
                return kept
        finally:
            await engine.dispose()

    kept = asyncio.run(scenario())
    assert _claimed(ready) == [kept]


def test_async_broker_uses_a_sync_connection_on_the_calling_thread(
    ready: sqlbroker.Broker, backend_url: str
) -> None:
    """A sqlite3 connection refuses other threads: the publish must not be offloaded."""

    async def scenario() -> str:
        async with sqlbroker.AsyncBroker(backend_url) as broker:
            with _driver(backend_url, autocommit=False) as conn:
                kept = await broker.publish("orders.kept", 1, conn=conn)
                conn.commit()
            return kept

    kept = asyncio.run(scenario())
    assert _claimed(ready) == [kept]


def test_sqlite_refuses_an_async_connection(make_broker: Any, backend_url: str) -> None:
    _only_sqlite(backend_url)

    async def scenario() -> None:
        engine = create_async_engine(backend_url.replace("sqlite://", "sqlite+aiosqlite://"))
        async with sqlbroker.AsyncBroker(backend_url) as broker, AsyncSession(engine) as session:
            await broker.publish("orders.a", 1, conn=session)

    pytest.importorskip("aiosqlite")
    with pytest.raises(sqlbroker.ValidationError, match="no async connections"):
        asyncio.run(scenario())
