"""docs/security.md's least-privilege setup runs as written: its SQL as the DBA, its shell
commands as the migrator login (no CREATEROLE), then the applications' logins work.

It runs in a PostgreSQL cluster of its own, so the role names are exactly the documented
ones. Authentication is ``trust`` there: the passwords are set but not checked."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlbroker
from pgserver import PostgresServer

pytestmark = pytest.mark.postgres

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
SECTION = "### Setting it up"


def _section() -> str:
    text = DOCS.read_text()
    start = text.index(SECTION)
    end = text.index("\n### ", start + len(SECTION))
    return text[start:end]


def _blocks(section: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", section, re.S)]


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    try:
        own = PostgresServer()
    except RuntimeError as error:
        pytest.skip(str(error))
    with own:
        own.execute("CREATE DATABASE app")
        yield own


def test_the_documented_least_privilege_setup_runs_as_written(server: PostgresServer) -> None:
    section = _section()

    def local(text: str) -> str:
        """The docs' host ``db`` is this cluster; everything else stays as written."""
        return text.replace("@db/app", f"@127.0.0.1:{server.port}/app")

    blocks = _blocks(section)
    assert [kind for kind, _ in blocks] == ["sql", "sh", "sql"], blocks
    (_, as_dba), (_, as_migrator), (_, dba_grants) = blocks
    server.execute(as_dba, dbname="app")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLBROKER_")}
    env["NO_COLOR"] = "1"
    script = str(Path(sys.executable).with_name("sqlbroker"))
    ran = []
    for line in as_migrator.splitlines():
        words = shlex.split(local(line), comments=True)
        if not words:
            continue
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value
            continue
        assert words[0] == "sqlbroker", line
        result = subprocess.run(
            [script, *words[1:]], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, (line, result.stdout, result.stderr)
        ran.append(words[1])
    assert ran == ["migrate", "roles"]
    # The migrator group, not the deploy login, owns what migrate created.
    owners = server.execute(
        "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'sqlbroker'", dbname="app"
    )
    assert owners == "sqlbroker_migrator"
    server.execute(dba_grants, dbname="app")

    app = r'Broker\("(postgresql://app_work:…@db/app)", schema="sqlbroker"\)'
    (documented,) = re.findall(app, section)
    work_url = local(documented.replace("…", "change-me"))
    web_url = work_url.replace("app_work", "app_web")
    with sqlbroker.Broker(web_url, schema="sqlbroker") as web:
        web.subscribe("emails", ["emails"])
        web.publish("emails", {"to": "ada"})
        with pytest.raises(sqlbroker.StorageError, match="permission denied"):
            web.claim("emails")
    with sqlbroker.Broker(work_url, schema="sqlbroker") as work:
        (delivery,) = work.claim("emails")
        work.dead_letter(delivery, reason="bounced")

    # The dashboard's login, with the schema on its search path as the docs say.
    (dash_url,) = re.findall(r"`(postgresql://app_dash:…@db/app\?options=[^`]+)`", section)
    env["SQLBROKER_URL"] = local(dash_url.replace("…", "change-me"))
    for args in (["stats"], ["dlq", "list"]):
        result = subprocess.run(
            [script, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, (args, result.stderr)
        assert "emails" in result.stdout
    replay = subprocess.run(
        [script, "dlq", "replay", "--subscription", "emails", "--yes", "--note", "fixed"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode == 0, replay.stderr
    with sqlbroker.Broker(work_url, schema="sqlbroker") as work:
        assert work.claim("emails") != []
    _dashboard_serves_the_schema(script, env, work_url.replace("app_work", "app_dash"))


def _dashboard_serves_the_schema(script: str, env: dict[str, str], url: str) -> None:
    """``sqlbroker dashboard --schema`` as the dashboard's login, the token from the
    environment (not the command line)."""
    token = "docs-setup-token-0123456789"
    env = {**env, "SQLBROKER_URL": url, "SQLBROKER_DASHBOARD_TOKEN": token}
    argv = [script, "dashboard", "--schema", "sqlbroker", "--port", "0"]
    with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stderr is not None
            line = process.stderr.readline()
            found = re.search(r" on http://\S+:(\d+)/", line)
            assert found, line
            request = urllib.request.Request(
                f"http://127.0.0.1:{found.group(1)}/api/overview",
                headers={"Authorization": f"Bearer {token}"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                overview = json.loads(response.read())
            assert [s["subscription"] for s in overview["subscriptions"]] == ["emails"]
        finally:
            process.terminate()
            process.communicate(timeout=30)
