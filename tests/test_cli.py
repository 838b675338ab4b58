"""The ``sqlbroker`` command line: click's CliRunner in process, plus real runs of the
installed console script.

Tests that touch a database take ``backend_url`` (tests/conftest.py): they run on a fresh
SQLite file and on a fresh, migrated PostgreSQL database.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import sqlbroker
from sqlbroker.core.serde import jsonable
from sqlbroker.interfaces.cli import cli
from sqlbroker.interfaces.cli import dlq as dlq_module
from sqlbroker.interfaces.cli.params import DURATION, NON_NEGATIVE_DURATION, PRIORITY, parse_headers
from sqlbroker.interfaces.cli.render import human_age
from sqlbroker.storage.sql import load_migrations

SECRET_URL = "postgresql://u:secret@127.0.0.1:1/x"
_QUIET_ENV: Mapping[str, str | None] = {
    "SQLBROKER_URL": None,
    "SQLBROKER_DEBUG": None,
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "NO_COLOR": "1",
}


def run(url: str | None, *args: str, input: str | bytes | None = None) -> Result:
    """Invoke the CLI in process; ``url`` goes to ``--url`` (``None``: not given)."""
    argv = ([] if url is None else ["--url", url]) + list(args)
    return CliRunner(env=_QUIET_ENV).invoke(cli, argv, input=input)


def ok(url: str | None, *args: str, input: str | bytes | None = None) -> Result:
    """Invoke the CLI and insist that it succeeded."""
    result = run(url, *args, input=input)
    assert result.exit_code == 0, (
        f"sqlbroker {' '.join(args)} exited {result.exit_code}\n"
        f"stdout: {result.stdout}\nstderr: {result.stderr}\nexception: {result.exception!r}"
    )
    return result


def json_of(url: str, *args: str) -> Any:
    return json.loads(ok(url, *args, "--json").stdout)


def stats_row(url: str, subscription: str) -> dict[str, Any]:
    rows = [row for row in json_of(url, "stats") if row["subscription"] == subscription]
    assert len(rows) == 1, rows
    return dict(rows[0])


def assert_clean_error(result: Result, code: int, *needles: str) -> None:
    """One ``error: …`` line on stderr, the expected exit code, and no traceback."""
    assert result.exit_code == code, (
        result.exit_code,
        result.stdout,
        result.stderr,
        result.exception,
    )
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite file (a read-only command refuses one that does not exist)."""
    url = f"sqlite:///{tmp_path}/cli.db"
    with sqlbroker.Broker(url) as broker:
        broker.migrate()
    return url


def _console_script() -> str:
    beside = Path(sys.executable).with_name("sqlbroker")
    found = str(beside) if beside.exists() else shutil.which("sqlbroker")
    assert found, "the sqlbroker console script is not installed (pip install -e .)"
    return found


def run_script(
    *args: str, url: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``sqlbroker`` console script in a subprocess; ``url`` goes
    through ``SQLBROKER_URL``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SQLBROKER_URL", "FORCE_COLOR", "SQLBROKER_DEBUG")
    }
    env["NO_COLOR"] = "1"
    if url is not None:
        env["SQLBROKER_URL"] = url
    return subprocess.run(
        [_console_script(), *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=120,
        check=False,
    )


def dead_letter_one(url: str, queue: str, payload: Any, **options: Any) -> int:
    """Send a message, claim it and dead-letter it through the Python API; its DLQ id."""
    with sqlbroker.Broker(url) as broker:
        broker.send(queue, payload, **options)
        (delivery,) = broker.claim(queue)
        try:
            raise ValueError("boom [not markup]")
        except ValueError as error:
            broker.dead_letter(delivery, reason="smtp refused [550]", error=error)
        return max(dead.id for dead in broker.dead_letters.list(subscription=queue))


# --- the whole loop --------------------------------------------------------------------------


def test_round_trip(backend_url: str) -> None:
    migrated = ok(backend_url, "migrate").stdout
    assert "schema is current at version" in migrated or "applied migration" in migrated
    assert "schema is current at version" in ok(backend_url, "migrate").stdout

    message_id = ok(backend_url, "send", "emails", '{"to": "ada@example.com"}').stdout.strip()
    assert len(message_id) == 36

    assert stats_row(backend_url, "emails")["ready"] == 1
    table = ok(backend_url, "stats").stdout
    assert "emails" in table
    assert "ready" in table
    assert "oldest ready" in table

    claimed = ok(backend_url, "claim", "emails", "--complete").stdout
    assert "ada@example.com" in claimed
    assert "completed 1 delivery" in claimed

    row = stats_row(backend_url, "emails")
    assert (row["ready"], row["running"]) == (0, 0)

    archived = json_of(backend_url, "archive", "emails")
    assert [(a["message_id"], a["outcome"]) for a in archived] == [(message_id, "completed")]
    assert "completed" in ok(backend_url, "archive", "--outcome", "completed").stdout


def test_round_trip_with_the_api_consumer(backend_url: str) -> None:
    """send (CLI) → stats (CLI) → claim and complete (Python API) → stats (CLI)."""
    message_id = ok(backend_url, "send", "jobs", '{"n": 1}', "--priority", "high").stdout.strip()
    assert stats_row(backend_url, "jobs")["ready"] == 1
    with sqlbroker.Broker(backend_url) as broker:
        (delivery,) = broker.claim("jobs")
        assert (delivery.message_id, delivery.payload, delivery.priority) == (
            message_id,
            {"n": 1},
            1,
        )
        broker.complete(delivery)
    assert stats_row(backend_url, "jobs")["ready"] == 0


def test_console_script_round_trip(backend_url: str) -> None:
    """The installed script, in real subprocesses, with the URL from SQLBROKER_URL."""
    sent = run_script("send", "emails", "-", url=backend_url, stdin='{"to": "grace@example.com"}')
    assert sent.returncode == 0, sent.stderr
    message_id = sent.stdout.strip()

    stats = run_script("stats", "--json", url=backend_url)
    assert stats.returncode == 0, stats.stderr
    assert [(s["subscription"], s["ready"]) for s in json.loads(stats.stdout)] == [("emails", 1)]

    claimed = run_script("claim", "emails", "--complete", "--json", url=backend_url)
    assert claimed.returncode == 0, claimed.stderr
    (delivery,) = json.loads(claimed.stdout)
    assert (delivery["message_id"], delivery["payload"]) == (
        message_id,
        {"to": "grace@example.com"},
    )
    assert "completed 1 delivery" in claimed.stderr

    archived = run_script("archive", url=backend_url)
    assert archived.returncode == 0
    assert "completed" in archived.stdout
    assert message_id in archived.stdout


def test_console_script_version_and_help() -> None:
    version = run_script("--version")
    assert version.returncode == 0
    assert sqlbroker.__version__ in version.stdout
    helped = run_script("--help")
    assert helped.returncode == 0
    for command in (
        "migrate",
        "schema",
        "send",
        "publish",
        "stats",
        "claim",
        "dlq",
        "pending",
        "archive",
    ):
        assert command in helped.stdout


# --- publishing ------------------------------------------------------------------------------


def test_publish_fans_out_with_every_option(backend_url: str) -> None:
    assert "orders.#" in ok(backend_url, "subscribe", "audit", "orders.#").stdout
    ok(backend_url, "subscribe", "billing", "orders.created", "invoices.*")
    names = {s["name"]: set(s["patterns"]) for s in json_of(backend_url, "subscriptions")}
    assert names == {"audit": {"orders.#"}, "billing": {"invoices.*", "orders.created"}}
    assert "invoices.*" in ok(backend_url, "subscriptions").stdout

    args = [
        "publish", "orders.created", '{"id": 7}', "--key", "customer-1",
        "--idempotency-key", "order-7", "--header", "traceparent=00-abc-01",
        "--header", "tenant=a=b", "--max-attempts", "3", "--priority", "0", "--ttl", "1h",
    ]  # fmt: skip
    first = ok(backend_url, *args).stdout.strip()
    assert ok(backend_url, *args).stdout.strip() == first, (
        "a repeated idempotency key returns the first id"
    )

    pending = json_of(backend_url, "pending", "audit")
    assert [(p["message_id"], p["key"], p["priority"], p["max_attempts"]) for p in pending] == [
        (first, "customer-1", 0, 3)
    ]
    assert {row["subscription"] for row in json_of(backend_url, "pending")} == {"audit", "billing"}
    with sqlbroker.Broker(backend_url) as broker:
        (delivery,) = broker.claim("billing")
    assert delivery.headers == {"traceparent": "00-abc-01", "tenant": "a=b"}
    assert delivery.expires_at is not None


def test_delay_makes_a_message_scheduled(backend_url: str) -> None:
    ok(backend_url, "send", "later", "1", "--delay", "10m")
    row = stats_row(backend_url, "later")
    assert (row["ready"], row["scheduled"]) == (0, 1)
    assert [p["state"] for p in json_of(backend_url, "pending", "--state", "scheduled")] == [
        "scheduled"
    ]
    assert "scheduled" in ok(backend_url, "pending", "later").stdout


def test_raw_and_stdin_payloads(sqlite_url: str) -> None:
    ok(
        sqlite_url,
        "send",
        "blobs",
        "-",
        "--raw",
        "--content-type",
        "text/plain",
        input=b"hi\x00there",
    )
    ok(sqlite_url, "send", "blobs", "-", input='{"from": "stdin"}')
    ok(sqlite_url, "send", "blobs", '"a JSON string"')
    deliveries = json_of(sqlite_url, "claim", "blobs", "--limit", "3", "--complete")
    assert [(d["content_type"], d["payload"]) for d in deliveries] == [
        ("text/plain", "aGkAdGhlcmU="),  # raw payloads are base64 in JSON output
        ("application/json", {"from": "stdin"}),
        ("application/json", "a JSON string"),
    ]
    # A raw payload is shown by size and type, in the dashboard's words too.
    ok(sqlite_url, "send", "raw", "hi", "--raw", "--content-type", "text/plain")
    assert "<2 bytes of text/plain>" in ok(sqlite_url, "claim", "raw", "--complete").stdout


def test_unrouted_publish_still_prints_an_id(sqlite_url: str) -> None:
    message_id = ok(sqlite_url, "publish", "nobody.listens", "{}").stdout.strip()
    assert [a["outcome"] for a in json_of(sqlite_url, "archive", "--message-id", message_id)] == [
        "unrouted"
    ]


# --- dead letters ----------------------------------------------------------------------------


def test_dlq_list_show_replay_purge(backend_url: str) -> None:
    dead_id = dead_letter_one(
        backend_url,
        "emails",
        {"to": "[bold]ada", "items": [1, 2]},
        headers={"traceparent": "00-f00"},
    )

    listed = ok(backend_url, "dlq", "list").stdout
    for expected in (str(dead_id), "emails", "smtp refused [550]", "ValueError", "1/5"):
        assert expected in listed
    (row,) = json_of(backend_url, "dlq", "list", "--subscription", "emails", "--reason", "refused")
    assert (row["id"], row["error_type"], row["payload"]) == (
        dead_id,
        "ValueError",
        {"to": "[bold]ada", "items": [1, 2]},
    )
    assert json_of(backend_url, "dlq", "list", "--error-type", "KeyError") == []
    assert "no dead letters" in ok(backend_url, "dlq", "list", "--topic", "other").stdout

    shown = ok(backend_url, "dlq", "show", str(dead_id)).stdout
    for expected in (
        '"to": "[bold]ada"',
        "traceparent",
        "00-f00",
        "ValueError: boom [not markup]",
        "Traceback",
    ):
        assert expected in shown
    assert json_of(backend_url, "dlq", "show", str(dead_id))["traceback"].startswith("Traceback")
    assert_clean_error(run(backend_url, "dlq", "show", "999999"), 1, "999999")

    # A filter selection needs --yes when nobody can be asked.
    refused = run(backend_url, "dlq", "replay", "--subscription", "emails")
    assert_clean_error(refused, 2, "--yes", "1 dead letter")
    assert stats_row(backend_url, "emails")["dead"] == 1

    replayed = ok(
        backend_url, "dlq", "replay", "--subscription", "emails", "--yes", "--note", "smtp fixed"
    )
    assert "replayed 1 dead letter" in replayed.stdout
    assert (
        stats_row(backend_url, "emails")["ready"],
        stats_row(backend_url, "emails")["dead"],
    ) == (1, 0)
    with sqlbroker.Broker(backend_url) as broker:
        (delivery,) = broker.claim("emails")
        assert delivery.replay_count == 1
        broker.dead_letter(delivery, reason="still failing")

    (again,) = json_of(backend_url, "dlq", "list")
    assert_clean_error(run(backend_url, "dlq", "purge", "--all"), 2, "--yes")
    assert_clean_error(run(backend_url, "dlq", "purge", "--all", str(again["id"])), 2, "--all")
    assert_clean_error(run(backend_url, "dlq", "purge"), 2, "--all")
    assert json_of(backend_url, "dlq", "purge", "--all", "--yes") == {"purged": 1}
    assert json_of(backend_url, "dlq", "list") == []
    assert "replayed 0 dead letters" in ok(backend_url, "dlq", "replay", "--all").stdout


def test_dlq_by_id_needs_no_confirmation_and_fails_on_missing_ids(sqlite_url: str) -> None:
    """Issue 23 item 10: a named id that does not exist is a non-zero exit (1, as
    ``dlq show`` of it) naming the missing ids, and nothing is changed."""
    dead_id = dead_letter_one(sqlite_url, "emails", {"n": 1})
    for verb in ("replay", "purge"):
        assert_clean_error(
            run(sqlite_url, "dlq", verb, str(dead_id), "424242", "999"),
            1,
            "no dead letter with ids 999, 424242",
        )
    assert_clean_error(run(sqlite_url, "dlq", "show", "424242"), 1, "424242")
    assert stats_row(sqlite_url, "emails")["dead"] == 1
    replayed = ok(sqlite_url, "dlq", "replay", str(dead_id), "--json")
    assert json.loads(replayed.stdout)["replayed"] == 1
    assert stats_row(sqlite_url, "emails")["ready"] == 1


def test_dlq_by_id_excluded_by_a_filter_is_a_failure(sqlite_url: str) -> None:
    dead_id = dead_letter_one(sqlite_url, "emails", {"n": 1})
    result = run(sqlite_url, "dlq", "purge", str(dead_id), "--topic", "other")
    assert_clean_error(result, 1, "purged 0 dead letters", "1 named dead letter did not match")
    assert stats_row(sqlite_url, "emails")["dead"] == 1


def test_dlq_actions_are_audited_as_the_cli_user(sqlite_url: str, tmp_path: Path) -> None:
    first = dead_letter_one(sqlite_url, "emails", {"n": 1})
    second = dead_letter_one(sqlite_url, "emails", {"n": 2})
    ok(sqlite_url, "dlq", "replay", str(first), "--note", "fixed the relay")
    ok(sqlite_url, "dlq", "purge", str(second))
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        audit = conn.execute(
            "SELECT actor, action, detail FROM sqlbroker_audit ORDER BY id"
        ).fetchall()
    assert [(actor.split(":")[0], action) for actor, action, _ in audit] == [
        ("cli", "dead.replay"),
        ("cli", "dead.purge"),
    ]
    assert "fixed the relay" in audit[0][2]


def test_dlq_confirmation_prompt(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlq_module, "stdin_is_terminal", lambda: True)
    dead_letter_one(sqlite_url, "emails", {"n": 1})

    declined = run(sqlite_url, "dlq", "purge", "--topic", "emails", input="n\n")
    assert declined.exit_code == 1
    prompt, error = declined.stderr.strip().splitlines()
    assert prompt.startswith("Purge 1 dead letter matching topic='emails'? [y/N]")
    assert error == "error: nothing was changed (purge not confirmed)"
    assert len(json_of(sqlite_url, "dlq", "list")) == 1

    accepted = ok(sqlite_url, "dlq", "purge", "--topic", "emails", input="y\n")
    assert "purged 1 dead letter" in accepted.stdout
    assert json_of(sqlite_url, "dlq", "list") == []


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["send", "q", "1", "--priority", "12"], "priority"),
        (["send", "bad topic!", "1"], "topic"),
        (["send", "q", "1", "--delay", "-3"], "delay"),
        (["send", "q", "1", "--ttl", "0"], "ttl"),
        (["send", "q", "1", "--max-attempts", "0"], "max_attempts"),
        (["send", "q", "1", "--header", "no-equals-sign"], "header"),
        (["send", "q", "{'single': 'quotes'}"], "payload"),
        (["send", "q", "NaN"], "payload"),
        (["send", "q", "1", "--content-type", "text/plain"], "--raw"),
        (["publish", "orders..created", "1"], "topic"),
        (["claim", "q", "--limit", "0"], "limit"),
        (["subscribe", "s", "orders.#.#x"], "patterns"),
        (["pending", "--limit", "0"], "limit"),
        (["stats", "--count", "2"], "--watch"),
        (["dlq", "list", "--subscription", "bad name"], "subscription"),
        (["schema", "--print", "--schema", "app"], "schema"),
    ],
)
def test_validation_errors_exit_2_and_name_the_field(
    sqlite_url: str, args: list[str], field: str
) -> None:
    assert_clean_error(run(sqlite_url, *args), 2, field)


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["pause", "nope"], "no subscription named 'nope'"),
        (["resume", "nope"], "no subscription named 'nope'"),
        (["subscriptions", "flow", "nope"], "no subscription named 'nope'"),
        (["subscriptions", "flow", "nope", "--max-running", "3"], "no subscription named 'nope'"),
        (["subscriptions", "retention", "nope"], "no subscription named 'nope'"),
        (["subscriptions", "retention", "nope", "--dead", "1d"], "no subscription named 'nope'"),
        (["claim", "nope"], "no subscription named 'nope'"),
        (["pending", "nope"], "no subscription named 'nope'"),
        (["archive", "nope"], "no subscription named 'nope'"),
        (["dlq", "list", "--subscription", "nope"], "no subscription named 'nope'"),
        (["dlq", "replay", "--subscription", "nope"], "no subscription named 'nope'"),
        (["dlq", "replay", "--subscription", "nope", "--yes"], "no subscription named 'nope'"),
        (["dlq", "purge", "--subscription", "nope", "--yes"], "no subscription named 'nope'"),
        (["saga", "show", "nope"], "no saga 'nope'"),
        (["schedules", "pause", "nope"], "no schedule named 'nope'"),
        (["dlq", "show", "7"], "7"),
        (["result", "01936b8e-0000-7000-8000-000000000000"], "unknown"),
    ],
)
def test_naming_what_does_not_exist_exits_1(sqlite_url: str, args: list[str], what: str) -> None:
    """Every command naming a subscription, saga, schedule, dead letter or message that does
    not exist fails alike: one line, exit 1 (a runtime failure; 2 is for bad input)."""
    ok(sqlite_url, "subscribe", "orders", "orders.*")
    assert_clean_error(run(sqlite_url, *args), 1, what)


def test_a_deleted_subscriptions_archive_and_dead_letters_still_list(sqlite_url: str) -> None:
    """Naming a subscription is checked only when nothing was found: the archive rows and
    dead letters a deleted subscription left behind stay reachable by its name, and an
    empty subscription that exists is empty, not missing."""
    dead_id = dead_letter_one(sqlite_url, "mail", {"n": 1})
    ok(sqlite_url, "send", "mail", "2")
    ok(sqlite_url, "claim", "mail", "--complete")
    assert "nothing to claim in mail" in ok(sqlite_url, "claim", "mail").stdout
    assert json_of(sqlite_url, "pending", "mail") == []
    with sqlbroker.Broker(sqlite_url) as broker:
        assert broker.unsubscribe("mail")
    assert [row["subscription"] for row in json_of(sqlite_url, "archive", "mail")] == ["mail"]
    listed = json_of(sqlite_url, "dlq", "list", "--subscription", "mail")
    assert [row["id"] for row in listed] == [dead_id]
    assert_clean_error(run(sqlite_url, "pending", "mail"), 1, "no subscription named 'mail'")
    assert_clean_error(
        run(sqlite_url, "dlq", "list", "--subscription", "mail", "--topic", "other"),
        1,
        "no subscription named 'mail'",
    )


def test_bad_json_says_what_is_wrong(sqlite_url: str) -> None:
    result = run(sqlite_url, "send", "q", '{"a": 1')
    assert_clean_error(result, 2, "payload", "not valid JSON", "line 1 column")
    assert json_of(sqlite_url, "stats") == [], "nothing was written"


def test_configuration_errors_exit_2(tmp_path: Path) -> None:
    """Issue 23 item 11: a URL that cannot work is bad input (exit 2), like a bad value."""
    assert_clean_error(run("mysql://x", "stats"), 2, "unsupported database")
    missing_dir = f"sqlite:///{tmp_path}/missing/dir/x.db"
    assert_clean_error(run(missing_dir, "send", "q", "1"), 2, "does not exist")


def test_password_never_printed() -> None:
    for args in (["stats"], ["migrate"], ["send", "q", "1"], ["dlq", "list"], ["schema"]):
        result = run(SECRET_URL, *args)
        assert result.exit_code == 1, (args, result.output, result.exception)
        assert "secret" not in result.output, result.output
        assert result.stderr.startswith("error: ")
    scripted = run_script("stats", "--url", SECRET_URL)
    assert scripted.returncode == 2  # --url belongs before the command
    scripted = run_script("--url", SECRET_URL, "stats")
    assert scripted.returncode == 1
    assert "secret" not in scripted.stdout + scripted.stderr
    assert scripted.stderr.startswith("error: ")
    assert "u:***@" in scripted.stderr
    assert "Traceback" not in scripted.stderr
    from_env = run_script("dlq", "list", url=SECRET_URL)
    assert from_env.returncode == 1
    assert "secret" not in from_env.stdout + from_env.stderr


def test_ctrl_c_exits_130_quietly(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(self: sqlbroker.Broker) -> list[sqlbroker.SubscriptionStats]:
        raise KeyboardInterrupt

    monkeypatch.setattr(sqlbroker.Broker, "stats", interrupted)
    result = run(sqlite_url, "stats", "--watch", "1")
    assert result.exit_code == 130
    assert "Aborted" not in result.output
    assert "Traceback" not in result.output


def test_unexpected_exceptions_are_one_line_without_a_password(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: sqlbroker.Broker) -> list[sqlbroker.Subscription]:
        raise RuntimeError(f"driver failed for {SECRET_URL}")

    monkeypatch.setattr(sqlbroker.Broker, "subscriptions", broken)
    result = run(sqlite_url, "subscriptions")
    assert_clean_error(result, 1, "RuntimeError", "u:***@")
    assert "secret" not in result.output


# --- schema ----------------------------------------------------------------------------------


def test_schema_print_sqlite_without_a_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/never-created.db"
    printed = ok(url, "schema", "--print").stdout
    assert "CREATE TABLE sqlbroker_message" in printed
    assert not (tmp_path / "never-created.db").exists()
    assert "CREATE TABLE sqlbroker_message" in run_script("schema", "--print", url=url).stdout


def test_schema_print_postgresql_without_connecting() -> None:
    pytest.importorskip("psycopg")
    printed = ok(SECRET_URL, "schema", "--print").stdout
    assert "CREATE TABLE sqlbroker_message" in printed
    in_schema = ok(SECRET_URL, "schema", "--print", "--schema", "queueing").stdout
    assert "queueing" in in_schema
    assert "secret" not in in_schema


def test_schema_print_without_the_postgres_extra_names_it_as_the_broker_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "sqlbroker.storage.postgres.backend", None)
    with pytest.raises(sqlbroker.ConfigurationError) as opening:
        sqlbroker.Broker(SECRET_URL)
    assert "pip install 'sqlbroker[postgres]'" in str(opening.value)
    assert_clean_error(run(SECRET_URL, "schema", "--print"), 2, str(opening.value))


def test_schema_version(backend_url: str) -> None:
    ok(backend_url, "migrate")
    latest = len(load_migrations("sqlbroker.storage.sqlite.migrations"))
    assert f"schema version {latest}" in ok(backend_url, "schema").stdout
    assert_clean_error(run(backend_url, "schema", "--schema", "x"), 2, "--print")


# --- watching and output ---------------------------------------------------------------------


def test_stats_watch_refreshes(sqlite_url: str) -> None:
    ok(sqlite_url, "send", "emails", "1")
    lines = ok(sqlite_url, "stats", "--watch", "0.01", "--count", "3", "--json").stdout.splitlines()
    assert [json.loads(line)[0]["ready"] for line in lines] == [1, 1, 1]
    tables = ok(sqlite_url, "stats", "--watch", "10ms", "--count", "2").stdout
    assert tables.count("oldest ready") == 2
    assert "Ctrl-C" in tables
    assert_clean_error(run(sqlite_url, "stats", "--watch", "0"), 2, "--watch")
    # A bare --watch before another option, or before the "--" that ends them, is the
    # default interval (one refresh: no wait).
    assert len(ok(sqlite_url, "stats", "--watch", "--count", "1", "--json").stdout.split()) == 1
    assert len(ok(sqlite_url, "stats", "--count=1", "--json", "--watch", "--").stdout.split()) == 1


def test_empty_views(sqlite_url: str) -> None:
    assert "no subscriptions yet" in ok(sqlite_url, "stats").stdout
    assert "no pending messages" in ok(sqlite_url, "pending").stdout
    assert "the archive is empty" in ok(sqlite_url, "archive").stdout
    ok(sqlite_url, "subscribe", "q", "q")
    assert "nothing to claim in q" in ok(sqlite_url, "claim", "q").stdout
    assert json_of(sqlite_url, "claim", "q") == []


def test_claim_without_complete_keeps_the_lease(sqlite_url: str) -> None:
    ok(sqlite_url, "send", "q", '{"a": 1}')
    claimed = ok(sqlite_url, "claim", "q", "--lease", "2m")
    assert '{"a":1}' in claimed.stdout
    assert "delivered again" in claimed.stderr
    assert stats_row(sqlite_url, "q")["running"] == 1
    assert "running" in ok(sqlite_url, "pending", "--state", "running").stdout


def test_value_parsers() -> None:
    assert [DURATION.convert(v, None, None) for v in ("1.5", "500ms", "30s", "5m", "2h", "1d")] == [
        1.5, 0.5, 30.0, 300.0, 7200.0, 86400.0,
    ]  # fmt: skip
    assert NON_NEGATIVE_DURATION.convert("0", None, None) == 0.0
    assert [PRIORITY.convert(v, None, None) for v in ("0", "urgent", "HIGH", "low")] == [0, 0, 1, 3]
    assert parse_headers(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    assert [human_age(v) for v in (None, 0.04, 3.21, 245.0, 9000.0, 302400.0)] == [
        "-", "0.0s", "3.2s", "4m", "2.5h", "3.5d",
    ]  # fmt: skip
    assert jsonable({"b": b"\x00\x01", "t": (1, 2)}) == {"b": "AAE=", "t": [1, 2]}
    # --json prints valid JSON: no NaN or Infinity (the dashboard's rule, one function)
    assert jsonable([float("nan"), float("-inf"), 1.5]) == [None, None, 1.5]


def test_click_usage_errors_exit_2(sqlite_url: str) -> None:
    for args in (
        ["send", "q", "1", "--delay", "soon"],
        ["send", "q", "1", "--priority", "asap"],
        ["nope"],
    ):
        result = run(sqlite_url, *args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["scheduler", "--poll-interval", "0"],
        ["dashboard", "--refresh", "0s"],
        ["healthcheck", "--max-lag=-1"],
        ["healthcheck", "--max-heartbeat-age", "0ms"],
        ["stats", "--watch", "0ms"],
    ],
)
def test_pacing_durations_must_be_positive(sqlite_url: str, args: list[str]) -> None:
    """A zero or negative interval is a usage error like any bad value: one line, exit 2."""
    assert_clean_error(run(sqlite_url, *args), 2, args[1].split("=")[0], "more than 0", "--help")


def test_the_pipeline_hands_its_url_over_in_the_environment_not_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlbroker pipeline export`` starts the pipeline program with the URL in its
    environment: a password on a command line is visible to every user through ``ps``.
    (The launch is recorded instead of run: the program itself runs in tests/spark.)"""
    pytest.importorskip("pyspark")
    from sqlbroker.interfaces.cli import pipeline as pipeline_module

    launched: list[tuple[list[str], Mapping[str, str] | None]] = []

    def record(command: list[str], env: Mapping[str, str] | None = None) -> int:
        launched.append((command, env))
        return 0

    monkeypatch.setattr(pipeline_module.subprocess, "call", record)
    result = run(SECRET_URL, "pipeline", "export", "--out", str(tmp_path), "--older-than", "7d")
    assert result.exit_code == 0, result.output
    ((command, env),) = launched
    assert not any("secret" in argument for argument in command), command
    assert env is not None
    assert env["SQLBROKER_URL"] == SECRET_URL
