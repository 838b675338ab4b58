"""The database identity that every Spark task checks before it touches the database: a
task reaching another database than its driver's (another file, a missing one, another
PostgreSQL database or schema) fails with sqlbroker's error, and creates nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from sqlbroker.core.errors import ConfigurationError, InvalidOption
from sqlbroker.spark.options import Connection


def test_tasks_open_the_drivers_database_only(backend_url: str, pg_or_file: Any) -> None:
    bound = Connection.of({"url": backend_url}).bind()
    broker, store = bound.open()
    assert store.identity() == bound.identity
    broker.close()
    assert bound.identity is not None

    other_url = pg_or_file()
    with sqlbroker.Broker(other_url, migrate=True) as other:
        other.subscribe("orders", "orders.#")
        elsewhere = replace(bound, url=Connection.of({"url": other_url}).url)
        with pytest.raises(ConfigurationError, match="is not the database of the driver"):
            elsewhere.open()
        # A copy of the same schema, or a fresh one, has an identity of its own.
        assert Connection.of({"url": other_url}).bind().identity != bound.identity


@pytest.fixture
def pg_or_file(backend_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """Another database of the same backend (PostgreSQL: cloned from the same template)."""
    if backend_url.startswith("sqlite"):
        yield lambda: f"sqlite:///{tmp_path}/other.db"
        return
    cluster = request.getfixturevalue("pg_server")
    clones: list[str] = []

    def make() -> str:
        clones.append(cluster.take_clone())
        return str(cluster.login_url(clones[-1]))

    yield make
    for name in clones:
        cluster.drop_later(name)


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    bound = Connection.of({"url": f"sqlite:///{tmp_path}/app.db"}).bind()
    missing = tmp_path / "elsewhere" / "app.db"
    missing.parent.mkdir()
    with pytest.raises(ConfigurationError, match="does not exist"):
        replace(bound, url=f"sqlite:///{missing}").open()
    assert list(missing.parent.iterdir()) == []


def test_an_unmigrated_file_is_another_database(tmp_path: Path) -> None:
    import sqlite3

    bound = Connection.of({"url": f"sqlite:///{tmp_path}/app.db"}).bind()
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).close()
    with pytest.raises(ConfigurationError, match="is not the database of the driver"):
        replace(bound, url=f"sqlite:///{plain}").open()
    with sqlite3.connect(plain) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


def test_the_driver_resolves_a_relative_sqlite_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    connection = Connection.of({"url": "sqlite:///data/app.db"})
    assert connection.url == f"sqlite:///{tmp_path}/data/app.db"
    with pytest.raises(InvalidOption, match="in-memory"):
        Connection.of({"url": "sqlite:///:memory:"})
