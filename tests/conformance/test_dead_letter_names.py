"""Dead letters name sqlbroker's own exceptions as users write them (``sqlbroker.Reject``,
not the module they live in), and a filter on the error type finds a row by its short
name, its public name or its full path — also rows stored before the public names."""

from __future__ import annotations

import sqlite3

import pytest

import sqlbroker
from helpers import claim_one

FULL = "sqlbroker.core.policies.Reject"


class Reject(Exception):  # an application's own class of the same short name
    pass


def _dead_by_worker(broker: sqlbroker.Broker) -> sqlbroker.DeadLetter:
    @broker.subscriber(queue="emails")
    def send(msg: sqlbroker.Message) -> None:
        raise sqlbroker.Reject("invalid address")

    broker.send("emails", {"to": "nobody"})
    broker.run_until_idle(timeout=30)
    (dead,) = broker.dead_letters.list(subscription="emails")
    return dead


def _store_old_name(backend_url: str, dead_id: int, request: pytest.FixtureRequest) -> None:
    """What an older sqlbroker wrote: the class's module path."""
    if backend_url.startswith("sqlite"):
        with sqlite3.connect(backend_url.removeprefix("sqlite:///")) as conn:
            conn.execute("UPDATE sqlbroker_dead SET error_type = ? WHERE id = ?", (FULL, dead_id))
        return
    import psycopg

    # As the superuser: the runtime login (SQLBROKER_TEST_PG_ROLE) may not rewrite rows.
    dbname = psycopg.conninfo.conninfo_to_dict(backend_url)["dbname"]
    superuser_url = request.getfixturevalue("pg_server").url(str(dbname))
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        conn.execute("UPDATE sqlbroker_dead SET error_type = %s WHERE id = %s", (FULL, dead_id))


@pytest.mark.parametrize("stored", ["new", "old"])
def test_reject_is_stored_shown_and_found_by_its_public_name(
    broker: sqlbroker.Broker, backend_url: str, stored: str, request: pytest.FixtureRequest
) -> None:
    dead = _dead_by_worker(broker)
    assert dead.error_type == "sqlbroker.Reject"
    if stored == "old":
        _store_old_name(backend_url, dead.id, request)
    assert broker.dead_letters.get(dead.id).error_type == "sqlbroker.Reject"
    for name in ("Reject", "sqlbroker.Reject", FULL):
        assert [d.id for d in broker.dead_letters.list(error_type=name)] == [dead.id], name
    for name in ("Rejec", "eject", "sqlbroker.Retry", "other.Reject"):
        assert broker.dead_letters.list(error_type=name) == [], name


def test_the_short_name_also_finds_an_application_class_of_that_name(
    broker: sqlbroker.Broker,
) -> None:
    broker.send("jobs", 1)
    broker.send("jobs", 2)
    broker.dead_letter(claim_one(broker, "jobs"), reason="mine", error=Reject("app"))
    broker.dead_letter(claim_one(broker, "jobs"), reason="lib", error=sqlbroker.Reject("lib"))
    assert {d.reason for d in broker.dead_letters.list(error_type="Reject")} == {"mine", "lib"}
    assert [d.reason for d in broker.dead_letters.list(error_type=f"{__name__}.Reject")] == ["mine"]
    assert [d.reason for d in broker.dead_letters.list(error_type="sqlbroker.Reject")] == ["lib"]
    assert broker.dead_letters.purge(error_type="sqlbroker.Reject") == 1
    assert [d.reason for d in broker.dead_letters.list()] == ["mine"]


def test_builtin_errors_keep_their_bare_name(broker: sqlbroker.Broker) -> None:
    broker.send("jobs", 1)
    broker.dead_letter(claim_one(broker, "jobs"), reason="bad", error=ValueError("x"))
    (dead,) = broker.dead_letters.list(error_type="ValueError")
    assert dead.error_type == "ValueError"


def test_dlq_list_error_type_on_the_cli(broker: sqlbroker.Broker, backend_url: str) -> None:
    from test_cli import json_of

    dead = _dead_by_worker(broker)
    for name in ("Reject", "sqlbroker.Reject", FULL):
        rows = json_of(backend_url, "dlq", "list", "--error-type", name)
        assert [(row["id"], row["error_type"]) for row in rows] == [(dead.id, "sqlbroker.Reject")]
