"""Migrations: concurrent migrators are serialized, and the printed schema (what Alembic or
Django users apply by hand) builds exactly what ``migrate()`` builds."""

from __future__ import annotations

import multiprocessing
import re
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlbroker
from sqlbroker.storage.postgres.backend import PostgresBackend
from sqlbroker.storage.sql import load_migrations
from sqlbroker.storage.sqlite.backend import SqliteBackend


def _migrate(url: str) -> list[int]:
    with sqlbroker.Broker(url, migrate=False) as broker:
        return broker.migrate()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no sqlbroker schema at all."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/empty.db"
        return
    cluster = request.getfixturevalue("pg_server")
    name = cluster.create_database(f"sqlbroker_empty_{uuid.uuid4().hex[:12]}")
    try:
        yield cluster.url(name)
    finally:
        cluster.drop_database(name)


def test_concurrent_migrators_apply_each_migration_once(empty_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        applied = pool.map(_migrate, [empty_url] * 4)
    expected = list(range(1, len(applied[0] + applied[1] + applied[2] + applied[3]) + 1))
    assert sorted(version for result in applied for version in result) == expected
    assert sum(1 for result in applied if result) == 1
    with sqlbroker.Broker(empty_url) as broker:
        assert broker.schema_version() == len(expected)
        broker.send("q", "works")
        assert [d.payload for d in broker.claim("q")] == ["works"]


def _sqlite_catalog(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master"
            " WHERE name LIKE 'sqlbroker%' AND name <> 'sqlbroker_schema_version'"
            " ORDER BY type, name"
        ).fetchall()
    return [(kind, name, " ".join((sql or "").split())) for kind, name, sql in rows]


def _versions(url: str) -> list[tuple[int, str]]:
    """The rows of the versions table, read through the broker's own check."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            rows = conn.execute("SELECT version, name FROM sqlbroker_schema_version ORDER BY 1")
            return [(int(version), str(name)) for version, name in rows]
    import psycopg

    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT version, name FROM sqlbroker_schema_version ORDER BY 1")
        return [(int(version), str(name)) for version, name in found]


def _works_without_migrating(url: str) -> None:
    """A database built from the printed script: accepted as is, nothing left to migrate."""
    with sqlbroker.Broker(url, migrate=False) as broker:
        broker.send("q", "works")
        assert [d.payload for d in broker.claim("q")] == ["works"]
        assert broker.migrate() == []


def _section_numbers(script: str) -> list[int]:
    return [int(number) for number in re.findall(r"^-- migration (\d{4})_", script, re.M)]


def test_printed_sqlite_schema_equals_migrations(tmp_path: Path) -> None:
    migrated = tmp_path / "migrated.db"
    _migrate(f"sqlite:///{migrated}")
    printed = tmp_path / "printed.db"
    script = SqliteBackend.schema_sql()
    if shutil.which("sqlite3"):  # as a DBA applies it
        subprocess.run(["sqlite3", str(printed)], input=script, text=True, check=True)
    else:
        with sqlite3.connect(printed) as conn:
            conn.executescript(script)
    assert _sqlite_catalog(printed) == _sqlite_catalog(migrated)
    assert _versions(f"sqlite:///{printed}") == _versions(f"sqlite:///{migrated}")
    assert _section_numbers(script) == [v for v, _ in _versions(f"sqlite:///{migrated}")]
    _works_without_migrating(f"sqlite:///{printed}")


_PG_CATALOG = """
SELECT 'column', table_name || '.' || column_name,
       data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
FROM information_schema.columns
WHERE table_schema = 'public' AND table_name LIKE 'sqlbroker%'
  AND table_name <> 'sqlbroker_schema_version'
UNION ALL
SELECT 'index', indexname, indexdef FROM pg_indexes
WHERE schemaname = 'public' AND tablename LIKE 'sqlbroker%'
  AND tablename <> 'sqlbroker_schema_version'
UNION ALL
SELECT 'options', relname, array_to_string(reloptions, ',') FROM pg_class
WHERE relname LIKE 'sqlbroker%' AND reloptions IS NOT NULL
ORDER BY 1, 2, 3
"""


@pytest.mark.postgres
@pytest.mark.skipif(not shutil.which("psql"), reason="needs the psql client")
def test_printed_postgres_schema_applied_with_psql(pg_server: object, tmp_path: Path) -> None:
    """``sqlbroker schema --print > schema.sql; psql -f schema.sql``, then the broker runs
    and ``sqlbroker migrate`` is a no-op — also with the tables in a schema of their own."""
    cluster = pg_server
    name = cluster.create_database(f"sqlbroker_psql_{uuid.uuid4().hex[:12]}")  # type: ignore[attr-defined]
    try:
        url = cluster.url(name)  # type: ignore[attr-defined]
        for schema in (None, "queue_1"):
            script = tmp_path / f"schema-{schema}.sql"
            script.write_text(PostgresBackend.schema_sql(schema), encoding="utf-8")
            assert _section_numbers(script.read_text(encoding="utf-8")) == list(
                range(1, len(load_migrations("sqlbroker.storage.postgres.migrations")) + 1)
            )
            subprocess.run(
                ["psql", "-q", "-X", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(script)],
                check=True,
                capture_output=True,
            )
            with sqlbroker.Broker(url, migrate=False, schema=schema) as broker:
                assert broker.migrate() == []
                broker.send("q", "works")
                assert [d.payload for d in broker.claim("q")] == ["works"]
    finally:
        cluster.drop_database(name)  # type: ignore[attr-defined]


@pytest.mark.postgres
def test_printed_postgres_schema_equals_migrations(pg_server: object) -> None:
    import psycopg

    cluster = pg_server
    migrated = cluster.create_database(f"sqlbroker_m_{uuid.uuid4().hex[:12]}")  # type: ignore[attr-defined]
    printed = cluster.create_database(f"sqlbroker_p_{uuid.uuid4().hex[:12]}")  # type: ignore[attr-defined]
    try:
        _migrate(cluster.url(migrated))  # type: ignore[attr-defined]
        catalogs = []
        for name, build in ((migrated, None), (printed, PostgresBackend.schema_sql())):
            with psycopg.connect(cluster.url(name), autocommit=True) as conn:  # type: ignore[attr-defined]
                if build is not None:
                    conn.execute(build.encode())
                catalogs.append(conn.execute(_PG_CATALOG).fetchall())
        assert catalogs[0]
        assert catalogs[1] == catalogs[0]
        assert _versions(cluster.url(printed)) == _versions(cluster.url(migrated))  # type: ignore[attr-defined]
        _works_without_migrating(cluster.url(printed))  # type: ignore[attr-defined]
    finally:
        for name in (migrated, printed):
            cluster.drop_database(name)  # type: ignore[attr-defined]
