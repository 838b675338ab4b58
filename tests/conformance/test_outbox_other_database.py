"""``publish(…, conn=c)`` on PostgreSQL with ``c`` connected to another database is refused
with a clear error, as on SQLite — through every kind of caller connection — and writes
nothing there; the same database reached another way is accepted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.orm import Session
from tests.helpers import stats_of

import sqlbroker

pytestmark = pytest.mark.postgres

REFUSED = "is connected to database"


@pytest.fixture
def other_url(pg_server: Any) -> Iterator[str]:
    """Another database of the same server, with a sqlbroker schema of its own."""
    name = pg_server.take_clone()
    try:
        yield pg_server.url(name)
    finally:
        pg_server.drop_later(name)


@pytest.fixture
def pg_broker(pg_url: str) -> Iterator[sqlbroker.Broker]:
    with sqlbroker.Broker(pg_url) as broker:
        broker.subscribe("sub", "orders.#")
        yield broker


def _messages_in(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM sqlbroker_message").fetchone()
    assert row is not None
    return int(row[0])


def test_psycopg_connection_to_another_database_is_refused(
    pg_broker: sqlbroker.Broker, other_url: str
) -> None:
    with psycopg.connect(other_url) as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open
        for _ in range(2):  # the second time from the cached identity
            with pytest.raises(sqlbroker.ValidationError, match=REFUSED):
                pg_broker.publish("orders.created", 1, conn=conn)
            with pytest.raises(sqlbroker.ValidationError, match=REFUSED):
                pg_broker.send("jobs", 1, conn=conn)
        assert conn.execute("SELECT 2").fetchone() == (2,), "the caller's transaction is usable"
        conn.commit()
    with (
        psycopg.connect(other_url, autocommit=True) as conn,
        pytest.raises(sqlbroker.ValidationError, match=REFUSED),
    ):
        pg_broker.publish_many([{"topic": "orders.a", "payload": 1}], conn=conn)
    assert _messages_in(other_url) == 0
    assert pg_broker.claim("sub") == []


def test_sqlalchemy_connection_to_another_database_is_refused(
    pg_broker: sqlbroker.Broker, other_url: str
) -> None:
    engine = sqlalchemy.create_engine(other_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with (
            engine.connect() as conn,
            pytest.raises(sqlbroker.ValidationError, match=REFUSED),
        ):
            pg_broker.publish("orders.created", 1, conn=conn)
        with Session(engine) as session, pytest.raises(sqlbroker.ValidationError, match=REFUSED):
            pg_broker.publish("orders.created", 1, conn=session)
    finally:
        engine.dispose()
    assert _messages_in(other_url) == 0


def test_async_connection_to_another_database_is_refused(pg_url: str, other_url: str) -> None:
    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(pg_url) as broker:
            for autocommit in (False, True):
                async with await psycopg.AsyncConnection.connect(
                    other_url, autocommit=autocommit
                ) as conn:
                    with pytest.raises(sqlbroker.ValidationError, match=REFUSED):
                        await broker.publish("orders.created", 1, conn=conn)
                    with pytest.raises(sqlbroker.ValidationError, match=REFUSED):
                        await broker.publish("orders.created", 1, conn=conn)

    asyncio.run(scenario())
    assert _messages_in(other_url) == 0


def test_django_connection_to_another_database_is_refused(
    pg_url: str, other_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    script = tmp_path / "django_other.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from urllib.parse import urlsplit

            import django
            from django.conf import settings

            import sqlbroker

            broker_url, other_url = sys.argv[1:3]
            parts = urlsplit(other_url)
            settings.configure(DATABASES={"default": {
                "ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                "USER": parts.username, "HOST": parts.hostname, "PORT": parts.port,
            }})
            django.setup()
            from django.db import connection, transaction

            with sqlbroker.Broker(broker_url) as broker, transaction.atomic():
                try:
                    broker.publish("orders.created", 1, conn=connection)
                except sqlbroker.ValidationError as error:
                    print("refused:", error)
            """
        ),
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, str(script), pg_url, other_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"refused: conn: {REFUSED}" in result.stdout
    assert _messages_in(other_url) == 0


def test_the_same_database_reached_another_way_is_accepted(
    pg_broker: sqlbroker.Broker, pg_url: str, pg_server: Any
) -> None:
    """Over the unix socket instead of TCP, as another login: still this broker's tables."""
    dbname = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_server.server.socket_url(str(dbname))) as conn:
        message_id = pg_broker.publish("orders.created", 1, conn=conn)
        conn.commit()
    assert [d.message_id for d in pg_broker.claim("sub")] == [message_id]


def test_a_search_path_without_the_brokers_tables_is_refused(
    pg_broker: sqlbroker.Broker, pg_url: str
) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET search_path TO pg_catalog")
        with pytest.raises(sqlbroker.ValidationError, match="search_path"):
            pg_broker.publish("orders.created", 1, conn=conn)


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_session_lost_before_the_publish_began_is_not_ambiguous(pg_url: str) -> None:
    """A caller's idle autocommit connection whose session ended: the read of its database
    identity fails before our transaction begins, so nothing was written (sync and async
    say the same)."""
    with sqlbroker.Broker(pg_url) as broker:
        broker.subscribe("sub", "orders.#")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            _terminate(pg_url, conn.info.backend_pid)
            with pytest.raises(sqlbroker.ConnectionLost) as lost:
                broker.publish("orders.created", 1, conn=conn)
        assert not lost.value.ambiguous
        assert stats_of(broker, "sub").ready == 0

    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(pg_url) as broker:
            conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
            async with conn:
                _terminate(pg_url, conn.info.backend_pid)
                with pytest.raises(sqlbroker.ConnectionLost) as lost:
                    await broker.publish("orders.created", 1, conn=conn)
            assert not lost.value.ambiguous

    asyncio.run(scenario())
