"""``sqlbroker roles`` and ``sqlbroker tenants`` end to end (click's CliRunner in process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from pgserver import quote_ident
from sqlbroker.interfaces.cli import cli


def run(url: str, *args: str) -> Result:
    return CliRunner(env={"SQLBROKER_URL": None}).invoke(cli, ["--url", url, *args])


@pytest.mark.postgres
def test_roles_and_tenants_from_the_command_line(pg_server: Any) -> None:
    name = pg_server.take_clone()
    url = pg_server.url(name)
    try:
        granted = run(url, "roles", "grant", "--create", "--json")
        assert granted.exit_code == 0, granted.output
        assert "SELECT" in json.loads(granted.output)["sqlbroker_reader"]["sqlbroker_message"]
        shown = run(url, "roles", "show")
        assert shown.exit_code == 0, shown.output
        assert "sqlbroker_producer" in shown.output
        pg_server.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cli_tenant')"
            f" THEN CREATE ROLE {quote_ident('cli_tenant')} LOGIN; END IF; END $$"
        )
        added = run(url, "tenants", "add", "acme", "--role", "cli_tenant")
        assert added.exit_code == 0, added.output
        assert run(url, "tenants", "enable").exit_code == 0
        listed = run(url, "tenants", "list", "--json")
        assert json.loads(listed.output) == {"enabled": True, "roles": [["cli_tenant", "acme"]]}
        bad = run(url, "tenants", "add", "acme corp", "--role", "cli_tenant")
        assert bad.exit_code == 2
        assert bad.output.startswith("error: tenant")
        missing = run(url, "tenants", "assign", "no-such-queue", "--tenant", "acme")
        assert missing.exit_code == 1
        assert run(url, "tenants", "disable").exit_code == 0
        hostile = run(url, "roles", "grant", "--schema", 'x"; DROP TABLE t; --')
        assert hostile.exit_code == 2
        assert "schema" in hostile.output
    finally:
        pg_server.drop_later(name)


def test_sqlite_refuses_roles_and_tenants(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    for args in (("roles", "grant"), ("tenants", "enable"), ("tenants", "list")):
        result = run(url, *args)
        assert result.exit_code == 2, result.output  # a configuration error
        assert "needs PostgreSQL" in result.output
