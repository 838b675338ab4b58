"""Shared fixtures: a throwaway PostgreSQL server, per-test databases and brokers.

``backend_url`` runs a test once on SQLite (a fresh file) and once on PostgreSQL (a fresh
database cloned from a migrated template). The ``postgresql`` run is marked ``postgres``;
it is skipped with a reason when the server binaries or the backend are missing, except
under CI (``CI`` set), where that is an error: CI must never pass by skipping.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

# tests/ is not a package; make its helper modules (pgserver, helpers) importable however
# pytest was invoked and whatever its import mode.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

import sqlbroker  # noqa: E402
from pgserver import PostgresServer, quote_ident  # noqa: E402

TEMPLATE_DB = "sqlbroker_template"
PG_ROLE_ENV = "SQLBROKER_TEST_PG_ROLE"
"""``SQLBROKER_TEST_PG_ROLE=runtime``: ``pg_url`` (and so every PostgreSQL test database)
connects as a login role holding only the runtime groups (producer, consumer, reader,
operator) instead of the superuser; the schema is migrated and granted by the superuser."""
RUNTIME_LOGIN = "sqlbroker_test_runtime"


def _unavailable(reason: str) -> None:
    """Skip locally, fail loudly in CI."""
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


class PgCluster:
    """The session's PostgreSQL server and a supply of fresh databases.

    Cloning a template costs ~0.2 s on its own but overlaps well, so clones are made ahead of
    need by a few background threads and dropped in the background after their test.
    """

    AHEAD = 4

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self._executor = ThreadPoolExecutor(max_workers=3, thread_name_prefix="pg-clone")
        self._ahead: deque[Future[str]] = deque()
        self._drops: list[Future[None]] = []
        self.login: str | None = None
        """The login role of ``pg_url`` (None: the superuser); see ``PG_ROLE_ENV``."""

    def url(self, dbname: str) -> str:
        return self.server.url(dbname)

    def login_url(self, dbname: str) -> str:
        url = self.server.url(dbname)
        if self.login is None:
            return url
        return url.replace(f"//{self.server.superuser}@", f"//{self.login}@", 1)

    def execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.server.url("postgres"), autocommit=True) as admin:
            admin.execute(sql.encode())

    def create_database(self, name: str, template: str | None = None) -> str:
        sql = f"CREATE DATABASE {quote_ident(name)}"
        if template is not None:
            # FILE_COPY clones a small template faster than WAL_LOG, more so in parallel.
            sql += f" TEMPLATE {quote_ident(template)} STRATEGY = FILE_COPY"
        self.execute(sql)
        return name

    def drop_database(self, name: str) -> None:
        self.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")

    def _clone(self) -> Future[str]:
        name = f"sqlbroker_test_{uuid.uuid4().hex[:16]}"
        return self._executor.submit(self.create_database, name, TEMPLATE_DB)

    def take_clone(self) -> str:
        """A fresh database cloned from the migrated template; the caller drops it."""
        while len(self._ahead) < self.AHEAD + 1:
            self._ahead.append(self._clone())
        return self._ahead.popleft().result(timeout=120)

    def drop_later(self, name: str) -> None:
        self._drops.append(self._executor.submit(self.drop_database, name))

    def close(self) -> None:
        for future in self._ahead:
            if not future.cancel():
                with contextlib.suppress(Exception):
                    self.drop_database(future.result(timeout=120))
        for future in self._drops:
            with contextlib.suppress(Exception):
                future.result(timeout=120)
        self._executor.shutdown(wait=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgCluster]:
    """A PostgreSQL server for the session with a migrated template database."""
    try:
        importlib.import_module("psycopg")
    except ImportError as error:
        _unavailable(f"psycopg is not installed ({error})")
    try:
        importlib.import_module("sqlbroker.storage.postgres.backend")
    except ImportError as error:
        _unavailable(f"the PostgreSQL backend cannot be imported ({error})")
    try:
        server = PostgresServer()
    except RuntimeError as error:
        _unavailable(str(error))
    server.start()
    cluster = PgCluster(server)
    try:
        cluster.create_database(TEMPLATE_DB)
        broker = sqlbroker.Broker(server.url(TEMPLATE_DB), migrate=True)
        try:
            broker.migrate()
            role = os.environ.get(PG_ROLE_ENV)
            if role:
                cluster.login = _runtime_login(cluster, broker, role)
        finally:
            broker.close()
        # CREATE DATABASE … TEMPLATE refuses a template that still has sessions.
        server.terminate_backends(TEMPLATE_DB)
        yield cluster
    finally:
        cluster.close()
        server.stop()


def _runtime_login(cluster: PgCluster, broker: sqlbroker.Broker, role: str) -> str:
    """Grant the group roles on the template and create the runtime login role."""
    from sqlbroker.features.security import grant_roles, role_names

    if role != "runtime":
        pytest.fail(f"{PG_ROLE_ENV}={role!r}: the only value is 'runtime'", pytrace=False)
    grant_roles(broker.backend, create=True)
    groups = ", ".join(
        quote_ident(name) for group, name in role_names().items() if group != "migrator"
    )
    cluster.execute(
        f"DROP ROLE IF EXISTS {quote_ident(RUNTIME_LOGIN)};"
        f" CREATE ROLE {quote_ident(RUNTIME_LOGIN)} LOGIN IN ROLE {groups}"
    )
    return RUNTIME_LOGIN


@pytest.fixture
def pg_url(pg_server: PgCluster) -> Iterator[str]:
    """A fresh, migrated database for one test, dropped afterwards (connecting as the
    runtime login role when ``SQLBROKER_TEST_PG_ROLE=runtime``)."""
    name = pg_server.take_clone()
    try:
        yield pg_server.login_url(name)
    finally:
        pg_server.drop_later(name)


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
    ids=["sqlite", "postgresql"],
)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/test.db"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def broker(backend_url: str) -> Iterator[sqlbroker.Broker]:
    with sqlbroker.Broker(backend_url, migrate=True) as opened:
        yield opened


@pytest.fixture
def clock() -> sqlbroker.ManualClock:
    return sqlbroker.ManualClock()


@pytest.fixture
def clocked_broker(backend_url: str, clock: sqlbroker.ManualClock) -> Iterator[sqlbroker.Broker]:
    with sqlbroker.Broker(backend_url, migrate=True, clock=clock) as opened:
        yield opened


@pytest.fixture
def make_broker(backend_url: str) -> Iterator[Any]:
    """A factory for extra brokers on the same database (other options); all closed at teardown."""
    opened: list[sqlbroker.Broker] = []

    def make(**options: Any) -> sqlbroker.Broker:
        created = sqlbroker.Broker(backend_url, migrate=True, **options)
        opened.append(created)
        return created

    yield make
    for created in reversed(opened):
        created.close()
