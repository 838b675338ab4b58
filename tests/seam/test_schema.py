"""The schema through the seam: the version (one plan on both dialects), ``migrate``,
``check_schema`` and the printed script, each rule once in storage/schema.py with the
dialect's files as data."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import SchemaError
from sqlbroker.storage.factory import open_backend


@pytest.fixture
def empty(backend_url: str, clock: ManualClock, tmp_path: Any) -> Iterator[Any]:
    """A backend on a database without sqlbroker's tables: a new SQLite file, or a
    PostgreSQL schema nobody created."""
    if backend_url.startswith("sqlite"):
        opened: Any = open_backend(f"sqlite:///{tmp_path}/empty.db", clock=clock)
    else:
        opened = open_backend(backend_url, clock=clock, schema="sqlbroker_never_made")
    try:
        yield opened
    finally:
        opened.close()


def test_a_migrated_database_is_at_the_last_version(backend: Any) -> None:
    expected = len(backend.schema_files.migrations())
    assert backend.schema_version() == expected
    assert backend.migrate() == []
    backend.check_schema()
    with backend.begin() as tx:
        assert tx.schema_version() == expected

    async def version() -> int:
        try:
            found: int = await backend.async_ops.schema_version()
            return found
        finally:
            await backend.close_async()

    assert asyncio.run(version()) == expected


def test_an_empty_database_is_at_version_zero_and_refused(empty: Any) -> None:
    assert empty.schema_version() == 0
    with pytest.raises(SchemaError, match=r"at version 0, this sqlbroker needs .*migrate"):
        empty.check_schema()


def test_a_migration_applies_every_version_once(backend_url: str, tmp_path: Any) -> None:
    if not backend_url.startswith("sqlite"):
        pytest.skip("a PostgreSQL test database is migrated already: see test_migrations.py")
    fresh: Any = open_backend(f"sqlite:///{tmp_path}/fresh.db", clock=ManualClock())
    try:
        numbers = [version for version, _, _ in fresh.schema_files.migrations()]
        assert fresh.migrate() == numbers
        assert fresh.migrate() == []
        assert fresh.schema_version() == numbers[-1]
        fresh.check_schema()
    finally:
        fresh.close()


def test_migrating_a_current_database_is_a_read(tmp_path: Any) -> None:
    """A current schema is looked at, not locked: a writer holding SQLite's write lock
    neither holds up nor fails a migrate with nothing to do (PostgreSQL's runtime role, which
    may not take the migration lock: tests/security/test_roles.py)."""
    path = tmp_path / "current.db"
    current: Any = open_backend(f"sqlite:///{path}", clock=ManualClock(), busy_timeout=0.05)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        assert current.migrate()
        writer.execute("BEGIN IMMEDIATE")
        assert current.migrate() == []
    finally:
        writer.close()
        current.close()


def test_the_printed_script_names_every_migration(backend: Any) -> None:
    script = type(backend).schema_sql()
    for version, name, _ in backend.schema_files.migrations():
        assert f"-- migration {version:04d}_{name} (schema version {version})" in script
