"""Schema: migrations are numbered alike on both backends, idempotent and complete."""

from __future__ import annotations

import re
from importlib import resources

import pytest

import sqlbroker
from helpers import table_counts

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
    before = table_counts(broker.backend)
    assert broker.migrate() == []
    assert broker.migrate() == []
    assert broker.schema_version() == len(_migration_numbers(broker.backend_name))
    assert table_counts(broker.backend) == before
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
