"""Tests for the throwaway PostgreSQL server helper in ``tests/pgserver.py``."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgserver import PostgresServer, find_bin_dir

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


def _psql() -> str:
    candidate = find_bin_dir() / "psql"
    return str(candidate) if candidate.exists() else shutil.which("psql") or "psql"


def _psql_url(url: str, sql: str) -> str:
    proc = subprocess.run(
        [_psql(), "-X", "-At", "-d", url, "-c", sql],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return proc.stdout.strip()


def test_execute_select_one(pg: PostgresServer) -> None:
    assert pg.execute("select 1") == "1"
    assert pg.execute("select current_user") == "postgres"
    assert pg.superuser == "postgres"


def test_urls_reach_the_server_over_tcp_and_socket(pg: PostgresServer) -> None:
    assert pg.url("postgres") == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    assert pg.socket_url("x").startswith("postgresql://postgres@/x?host=/")

    tcp = _psql_url(pg.url("postgres"), "select inet_server_addr(), inet_server_port()")
    assert tcp == f"127.0.0.1|{pg.port}"
    # inet_server_addr() is NULL on a unix-socket connection.
    unix = _psql_url(pg.socket_url("postgres"), "select inet_server_addr() is null")
    assert unix == "t"


def test_execute_reports_sql_errors(pg: PostgresServer) -> None:
    with pytest.raises(RuntimeError, match="no_such_table"):
        pg.execute("select * from no_such_table")


def test_create_database_from_template_and_drop(pg: PostgresServer) -> None:
    template, clone = 'tpl Odd"Name', "clone_db"
    pg.create_database(template)
    try:
        pg.execute(
            "create table items (id int primary key); insert into items values (1), (2)",
            dbname=template,
        )
        pg.create_database(clone, template=template)
        assert pg.execute("select count(*) from items", dbname=clone) == "2"

        pg.drop_database(clone)
        exists = pg.execute(f"select count(*) from pg_database where datname = '{clone}'")
        assert exists == "0"
    finally:
        pg.drop_database(clone, missing_ok=True)
        pg.drop_database(template)


@contextmanager
def _sleeping_session(pg: PostgresServer, dbname: str) -> Iterator[subprocess.Popen[bytes]]:
    """A psql client sitting in pg_sleep() on ``dbname``, connected on entry."""
    url = pg.url(dbname) + "?application_name=sleeper"
    session = subprocess.Popen(
        [_psql(), "-X", "-d", url, "-c", "select pg_sleep(60)"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        query = "select count(*) from pg_stat_activity where application_name = 'sleeper'"
        while pg.execute(query) == "0":
            assert time.monotonic() < deadline, "psql session never connected"
            time.sleep(0.05)
        yield session
    finally:
        session.kill()
        session.wait()


def test_drop_database_terminates_open_sessions(pg: PostgresServer) -> None:
    pg.create_database("busy")
    try:
        with _sleeping_session(pg, "busy") as session:
            pg.drop_database("busy")
            assert session.wait(timeout=30) != 0
    finally:
        pg.drop_database("busy", missing_ok=True)


def test_terminate_backends(pg: PostgresServer) -> None:
    with _sleeping_session(pg, "postgres") as session:
        assert pg.terminate_backends("postgres") == 1
        assert session.wait(timeout=30) != 0


def test_restart_immediate_keeps_port_and_committed_data(pg: PostgresServer) -> None:
    port, host = pg.port, pg.host
    started_before = pg.execute("select pg_postmaster_start_time()")
    # synchronous_commit is off server-wide; make this commit durable so it
    # must survive the simulated crash.
    pg.execute("set synchronous_commit = on; create table survives_crash (id int)")

    pg.restart("immediate")

    assert (pg.port, pg.host) == (port, host)
    assert pg.execute("select 1") == "1"
    assert pg.execute("select pg_postmaster_start_time()") != started_before
    assert pg.execute("select to_regclass('survives_crash') is not null") == "t"
    assert "database system was interrupted" in pg.log_path.read_text()
    assert _psql_url(pg.url("postgres"), "select 1") == "1"
    pg.execute("drop table survives_crash")


def test_restart_fast(pg: PostgresServer) -> None:
    port = pg.port
    pg.restart("fast")
    assert pg.port == port
    assert pg.execute("select 1") == "1"


def test_stop_removes_everything_and_is_idempotent() -> None:
    server = PostgresServer().start()
    base = Path(server.data_dir).parent
    assert base.name.startswith("sqlbroker-pg-")
    assert server.execute("select 1") == "1"

    server.stop()
    server.stop()

    assert not base.exists()
    with pytest.raises(RuntimeError, match="not running"):
        server.execute("select 1")


def test_missing_binaries_give_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SQLBROKER_PG_BIN", str(tmp_path))
    with pytest.raises(RuntimeError, match="SQLBROKER_PG_BIN"):
        PostgresServer()
