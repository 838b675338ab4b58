"""Issue 23 (the first hour) and issue 29 item 7, as far as the command line goes: tables
that stay readable at 80 columns, reads that never create or migrate a database, one-line
errors with exit 2 for bad input or configuration, a refused login that is not a
"connection lost", and stored text that cannot drive the terminal.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner, Result
from rich.cells import cell_len

import sqlbroker
from sqlbroker.interfaces.cli import cli

_ENV: Mapping[str, str | None] = {
    "SQLBROKER_URL": None,
    "SQLBROKER_DEBUG": None,
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "NO_COLOR": "1",
    "COLUMNS": None,
}


def run(url: str | None, *args: str, columns: int | None = None) -> Result:
    env = dict(_ENV)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    argv = ([] if url is None else ["--url", url]) + list(args)
    return CliRunner(env=env).invoke(cli, argv, prog_name="sqlbroker")


def one_error_line(result: Result, code: int, *needles: str) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/cli.db"
    with sqlbroker.Broker(url) as broker:
        broker.migrate()
    return url


# --- item 3: tables at 80 and 120 columns ---------------------------------------------------

LONG_NAMES = ["orders-billing-eu-west-1", "emails", "payments.refunds_priority"]


@pytest.mark.parametrize("columns", [80, 120])
def test_stats_keeps_the_subscription_column_at_any_width(sqlite_url: str, columns: int) -> None:
    with sqlbroker.Broker(sqlite_url) as broker:
        for name in LONG_NAMES:
            broker.subscribe(name, [name.replace(".", "_") + ".#"])
            broker.publish(name.replace(".", "_") + ".created", {"n": 1})
    result = run(sqlite_url, "stats", columns=columns)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= columns, result.stdout
    header = next(line for line in lines if "subscription" in line)
    for needed in ("ready", "dead", "oldest ready"):
        assert needed in header, header
    for name in LONG_NAMES:
        assert any(name in line for line in lines), (name, result.stdout)
    assert "not shown at" in result.stdout, "the hidden columns are named"
    assert "--json" in result.stdout


@pytest.mark.parametrize("columns", [80, 120])
def test_list_tables_fit_the_terminal(sqlite_url: str, columns: int) -> None:
    with sqlbroker.Broker(sqlite_url) as broker:
        broker.send("emails-to-customers-in-europe", {"to": "ada@example.com"})
        broker.send("emails-to-customers-in-europe", {"to": "bob@example.com"})
        (delivery,) = broker.claim("emails-to-customers-in-europe", limit=1)
        broker.dead_letter(delivery, reason="the SMTP relay refused the address for good")
        broker.publish("nobody.listens.here", 1)
    for args in (["pending"], ["dlq", "list"], ["archive"], ["subscriptions"]):
        result = run(sqlite_url, *args, columns=columns)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert max(cell_len(line) for line in lines) <= columns, (args, result.stdout)
        assert any("subscription" in line or "name" in line for line in lines), result.stdout


# --- item 9: reads never create or migrate a database ------------------------------------

READS = [
    ["stats"],
    ["pending"],
    ["archive"],
    ["subscriptions"],
    ["dlq", "list"],
    ["dlq", "show", "1"],
    ["saga", "list"],
    ["schedules"],
    ["audit"],
    ["schema"],
    ["metrics", "--once"],
    ["healthcheck"],
]


@pytest.mark.parametrize("args", READS, ids=[" ".join(a) for a in READS])
def test_a_read_without_a_database_names_it_and_creates_nothing(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    one_error_line(run(None, *args), 2, str(tmp_path / "sqlbroker.db"), "SQLBROKER_URL")
    assert list(tmp_path.iterdir()) == []


def test_a_read_does_not_migrate(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER)")
        conn.commit()
    result = run(f"sqlite:///{path}", "stats")
    one_error_line(result, 1, "schema", "sqlbroker migrate")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
    assert tables == ["orders"]


def test_a_write_still_creates_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(None, "send", "emails", "1").exit_code == 0
    assert (tmp_path / "sqlbroker.db").exists()
    assert run(None, "stats").exit_code == 0


# --- item 11: every error is one line ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["stats", "--bogus"], "sqlbroker stats --help"),
        (["--bogus", "stats"], "sqlbroker --help"),
        (["bogus"], "No such command"),
        (["dlq", "show", "seven"], "sqlbroker dlq show --help"),
        (["send"], "Missing argument"),
        (["pending", "--state", "sleeping"], "--state"),
    ],
)
def test_usage_errors_are_one_line_exit_2(sqlite_url: str, args: list[str], needle: str) -> None:
    one_error_line(run(sqlite_url, *args), 2, needle)


def test_a_bare_group_still_shows_its_help(sqlite_url: str) -> None:
    result = run(sqlite_url, "dlq")
    assert "replay" in result.output
    assert "error:" not in result.output


def test_deeply_nested_json_is_a_validation_error(sqlite_url: str) -> None:
    for depth in (100, 100_000):
        nested = "[" * depth + "]" * depth
        one_error_line(run(sqlite_url, "send", "q", nested), 2, "payload", "nests deeper")
    with sqlbroker.Broker(sqlite_url) as broker:
        assert broker.stats() == []


@pytest.mark.parametrize(
    "url",
    ["mysql://u@h/db", "postgresql://u@h1:5432,h2:notaport/db", "sqlite://relative.db"],
)
def test_unusable_urls_exit_2(url: str) -> None:
    one_error_line(run(url, "stats"), 2)
    one_error_line(run(url, "send", "q", "1"), 2)


def test_a_percent_escape_that_is_not_utf8_is_an_invalid_url() -> None:
    """Found by tests/security/test_urls.py's property test: ``%a0`` in a password
    escaped as a raw UnicodeDecodeError."""
    with pytest.raises(sqlbroker.InvalidURL, match="not UTF-8") as raised:
        sqlbroker.Broker("postgresql://u:Q%a0Q@h:5432/db")
    assert "%a0" not in str(raised.value)
    one_error_line(run("postgresql://u:Q%a0Q@h:5432/db", "stats"), 2, "not UTF-8")


@contextlib.contextmanager
def _port_in_use() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_port_in_use_is_one_line_naming_it(sqlite_url: str) -> None:
    with _port_in_use() as port:
        for args in (["dashboard"], ["metrics"]):
            one_error_line(
                run(sqlite_url, *args, "--port", str(port)),
                2,
                f"127.0.0.1:{port}",
                "already in use",
            )


# --- item 12: a refused login is not a lost connection; reads tell no outcome --------------


@pytest.fixture
def password_login(pg_server: Any, pg_url: str) -> Iterator[tuple[str, str]]:
    """A role that logs in with a SCRAM password over TCP (the test server trusts loopback
    for every other role): ``(url with the right password, url with a wrong one)``."""
    role = f"pw_{uuid.uuid4().hex[:12]}"
    pg_server.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD 'right-horse'")
    hba = Path(pg_server.server.data_dir) / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
    pg_server.execute("SELECT pg_reload_conf()")
    parts = urlsplit(pg_url)
    netloc = f"{role}:{{}}@{parts.hostname}:{parts.port}"
    right, wrong = (
        urlunsplit(parts._replace(netloc=netloc.format(pw))) for pw in ("right-horse", "wrong")
    )
    try:
        yield right, wrong
    finally:
        hba.write_text(original)
        pg_server.execute("SELECT pg_reload_conf()")


@pytest.mark.postgres
def test_a_wrong_password_is_an_authentication_error(password_login: tuple[str, str]) -> None:
    right, wrong = password_login
    with sqlbroker.Broker(right) as broker:
        assert broker.stats() == []
    with sqlbroker.Broker(wrong) as broker:
        with pytest.raises(sqlbroker.AuthenticationError) as raised:
            broker.stats()
        assert not isinstance(raised.value, sqlbroker.ConnectionLost)
        assert isinstance(raised.value, sqlbroker.ConfigurationError)
        assert "password authentication failed" in str(raised.value)
        assert "outcome" not in str(raised.value)
        assert "wrong" not in str(raised.value).replace("wrong password", "")
    line = one_error_line(run(wrong, "stats"), 2, "refused the login")
    assert "outcome" not in line
    one_error_line(run(wrong, "send", "q", "1"), 2, "refused the login")


@pytest.mark.postgres
def test_an_unknown_role_or_database_is_not_transient(pg_url: str) -> None:
    parts = urlsplit(pg_url)
    no_role = urlunsplit(parts._replace(netloc=f"no_such_role@{parts.hostname}:{parts.port}"))
    with sqlbroker.Broker(no_role) as broker, pytest.raises(sqlbroker.AuthenticationError):
        broker.stats()
    no_db = urlunsplit(parts._replace(path="/no_such_database_here"))
    with sqlbroker.Broker(no_db) as broker, pytest.raises(sqlbroker.ConfigurationError) as raised:
        broker.stats()
    assert not isinstance(raised.value, sqlbroker.ConnectionLost)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.postgres
def test_an_unreachable_server_tells_an_outcome_only_for_writes(pg_url: str) -> None:
    parts = urlsplit(pg_url)
    down = urlunsplit(parts._replace(netloc=f"postgres@127.0.0.1:{_closed_port()}"))
    read = one_error_line(run(down, "stats"), 1, "cannot connect")
    assert "outcome" not in read
    with sqlbroker.Broker(down, connect_timeout=1) as broker:
        with pytest.raises(sqlbroker.ConnectionLost) as raised:
            broker.stats()
        assert "outcome" not in str(raised.value)
        assert not raised.value.write


def test_connection_lost_names_an_outcome_only_for_writes() -> None:
    assert str(sqlbroker.ConnectionLost("gone", ambiguous=True)) == "gone (outcome unknown)"
    assert str(sqlbroker.ConnectionLost("gone", ambiguous=False)) == "gone (outcome not applied)"
    assert str(sqlbroker.ConnectionLost("gone", ambiguous=False, write=False)) == "gone"


# --- issue 29 item 7: stored text cannot drive the terminal -------------------------------

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202egnp.exe"


def test_stored_escape_sequences_are_shown_escaped(sqlite_url: str) -> None:
    with sqlbroker.Broker(sqlite_url) as broker:
        broker.send("evil", {"text": HOSTILE}, headers={"x": HOSTILE})
        broker.send("evil", {"text": HOSTILE})
        first, second = broker.claim("evil", limit=2)
        broker.dead_letter(first, reason=HOSTILE, error=ValueError(HOSTILE))
        broker.retry(second, after=0, error=ValueError(HOSTILE))
        dead_id = broker.dead_letters.list()[0].id
    for args in (
        ["dlq", "list"],
        ["dlq", "show", str(dead_id)],
        ["dlq", "show", str(dead_id), "--json"],
        ["dlq", "list", "--json"],
        ["pending"],
        ["pending", "--json"],
    ):
        result = run(sqlite_url, *args, columns=200)
        assert result.exit_code == 0, (args, result.output)
        for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert raw not in result.output, (args, raw, result.output)
        assert "\\x1b" in result.output or "\\u001b" in result.output, (args, result.output)
