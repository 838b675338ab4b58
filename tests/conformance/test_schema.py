"""Schema: migrations are numbered alike on both backends, idempotent and complete."""

from __future__ import annotations

import re
from importlib import resources

import pytest

import sqlbroker

_MIGRATION = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")


def _migration_numbers(backend: str) -> list[int]:
    package = f"sqlbroker.storage.{'postgres' if backend == 'postgresql' else 'sqlite'}.migrations"
    names = [entry.name for entry in resources.files(package).iterdir()]
    return sorted(int(m.group(1)) for name in names if (m := _MIGRATION.fullmatch(name)))


def test_schema_version_equals_the_number_of_migrations(broker: sqlbroker.Broker) -> None:
    numbers = _migration_numbers(broker.backend_name)
    assert numbers == list(range(1, len(numbers) + 1))
    broker.stats()  # migrate=True migrates on first use; schema_version() only looks
    assert broker.schema_version() == len(numbers)


def test_migrate_twice_is_a_no_op(broker: sqlbroker.Broker) -> None:
    broker.migrate()
    broker.send("q", "survives")
    before = broker.backend.table_counts()
    assert broker.migrate() == []
    assert broker.migrate() == []
    assert broker.schema_version() == len(_migration_numbers(broker.backend_name))
    assert broker.backend.table_counts() == before
    assert broker.claim("q")[0].payload == "survives"


def test_fresh_sqlite_database_migrates_everything(tmp_path: object) -> None:
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/fresh.db", migrate=False) as fresh:
        assert fresh.schema_version() == 0
        assert fresh.migrate() == _migration_numbers("sqlite")
        assert fresh.schema_version() == len(_migration_numbers("sqlite"))


def test_sqlite_creates_its_schema_on_first_use(tmp_path: object) -> None:
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/auto.db") as auto:
        auto.send("q", 1)
        assert auto.schema_version() == len(_migration_numbers("sqlite"))


def test_missing_schema_raises_schema_error(tmp_path: object) -> None:
    with (
        sqlbroker.Broker(f"sqlite:///{tmp_path}/bare.db", migrate=False) as bare,
        pytest.raises(sqlbroker.SchemaError, match="migrate"),
    ):
        bare.send("q", 1)


def test_both_backends_have_the_same_migration_numbers() -> None:
    assert _migration_numbers("postgresql") == _migration_numbers("sqlite")


def test_table_counts_name_every_table(broker: sqlbroker.Broker, backend_url: str) -> None:
    """The bad-input tests compare table_counts() before and after: it must see every
    table the migrations create (but the version table), or a stray write would hide."""
    broker.stats()
    if backend_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(backend_url.removeprefix("sqlite:///"))
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    else:
        import psycopg

        conn = psycopg.connect(backend_url)  # type: ignore[assignment]
        # The archive's partitions are counted through the archive.
        query = (
            "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') AND NOT relispartition"
            " AND relnamespace = current_schema()::regnamespace"
        )
    try:
        tables = {row[0] for row in conn.execute(query) if row[0].startswith("sqlbroker_")}
    finally:
        conn.close()
    assert set(broker.backend.table_counts()) == tables - {"sqlbroker_schema_version"}
