"""The documented remote dashboard (``--host 0.0.0.0`` with a token, the token from a file)
answers real requests; request bodies are bounded whatever ``Content-Length`` says; the
token never reaches a log."""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import sqlbroker
from helpers import claim_one
from sqlbroker.interfaces.cli import cli
from sqlbroker.interfaces.dashboard import Dashboard

TOKEN = "remote-token-0123456789"


@pytest.fixture
def remote(broker: sqlbroker.Broker) -> Iterator[Dashboard]:
    board = Dashboard(broker, host="0.0.0.0", port=0, token=TOKEN)
    board.start()
    yield board
    board.stop()


def _request(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(body or None)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_a_remote_dashboard_answers_to_the_names_it_is_reached_by(
    remote: Dashboard, broker: sqlbroker.Broker
) -> None:
    host = {"Host": f"broker.example.internal:{remote.port}"}
    bearer = {**host, "Authorization": f"Bearer {TOKEN}"}
    status, _, body = _request(remote.port, "GET", "/api/overview", bearer)
    assert status == 200, body
    assert _request(remote.port, "GET", "/api/overview", host)[0] == 401
    # The browser's login: /?token=… sets the cookie, the page then works with it.
    status, headers, _ = _request(remote.port, "GET", f"/?token={TOKEN}", host)
    assert status == 303
    cookie = headers["Set-Cookie"].split(";")[0]
    status, _, page = _request(remote.port, "GET", "/", {**host, "Cookie": cookie})
    assert status == 200
    assert remote.csrf in page.decode()
    # An action from the page: same origin as the Host it was served under.
    broker.send("jobs", 1)
    broker.dead_letter(claim_one(broker, "jobs"), reason="bad")
    dead_id = broker.dead_letters.list()[0].id
    action = {
        **host,
        "Cookie": cookie,
        "Origin": f"http://broker.example.internal:{remote.port}",
        "X-CSRF-Token": remote.csrf,
        "Content-Type": "application/json",
    }
    payload = json.dumps({"ids": [dead_id]}).encode()
    action["Content-Length"] = str(len(payload))
    cross = {**action, "Origin": "http://evil.example"}
    assert _request(remote.port, "POST", "/api/dead/purge", cross, payload)[0] == 403
    status, _, body = _request(remote.port, "POST", "/api/dead/purge", action, payload)
    assert (status, json.loads(body)) == (200, {"purged": 1})


def test_a_dashboard_on_every_ipv6_address_serves_with_its_token(
    broker: sqlbroker.Broker,
) -> None:
    board = Dashboard(broker, host="::", port=0, token=TOKEN)
    board.start()
    try:
        assert board.url == f"http://[::]:{board.port}/"
        headers = {"Host": f"[2001:db8::1]:{board.port}", "Authorization": f"Bearer {TOKEN}"}
        assert _request(board.port, "GET", "/api/overview", headers)[0] == 200
    finally:
        board.stop()


def test_a_loopback_dashboard_without_a_token_still_checks_the_host(
    broker: sqlbroker.Broker,
) -> None:
    board = Dashboard(broker, port=0)
    board.start()
    try:
        foreign = {"Host": f"rebound.example:{board.port}"}
        assert _request(board.port, "GET", "/api/overview", foreign)[0] == 421
        own = {"Host": f"127.0.0.1:{board.port}"}
        assert _request(board.port, "GET", "/api/overview", own)[0] == 200
    finally:
        board.stop()


@pytest.mark.parametrize(
    ("length", "status"),
    [("-1", 400), ("abc", 400), ("+5", 400), ("1e3", 400), (str(64 * 1024 + 1), 413)],
)
def test_a_post_body_needs_a_plain_bounded_length(
    remote: Dashboard, length: str, status: int
) -> None:
    headers = {
        "Host": f"127.0.0.1:{remote.port}",
        "Authorization": f"Bearer {TOKEN}",
        "X-CSRF-Token": remote.csrf,
        "Content-Type": "application/json",
        "Content-Length": length,
    }
    # The client keeps its socket open: a server that read "to the end" would hang here.
    with socket.create_connection(("127.0.0.1", remote.port), timeout=10) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        sock.sendall(f"POST /api/dead/purge HTTP/1.1\r\n{head}\r\n".encode() + b"{}")
        reply = sock.recv(4096).decode()
    assert reply.startswith(f"HTTP/1.0 {status} "), reply


def test_a_chunked_or_doubled_length_is_refused(remote: Dashboard) -> None:
    base = {
        "Host": f"127.0.0.1:{remote.port}",
        "Authorization": f"Bearer {TOKEN}",
        "X-CSRF-Token": remote.csrf,
        "Content-Type": "application/json",
    }
    chunked = {**base, "Transfer-Encoding": "chunked"}
    assert (
        _request(remote.port, "POST", "/api/dead/purge", chunked, b"2\r\n{}\r\n0\r\n\r\n")[0] == 411
    )
    with socket.create_connection(("127.0.0.1", remote.port), timeout=10) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in base.items())
        doubled = "Content-Length: 2\r\nContent-Length: 70000\r\n"
        sock.sendall(f"POST /api/dead/purge HTTP/1.1\r\n{head}{doubled}\r\n{{}}".encode())
        assert sock.recv(4096).decode().startswith("HTTP/1.0 400 ")


def test_the_token_never_reaches_the_log(
    remote: Dashboard, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sqlbroker.dashboard")
    host = {"Host": f"127.0.0.1:{remote.port}"}
    assert _request(remote.port, "GET", f"/?token={TOKEN}", host)[0] == 303
    assert _request(remote.port, "GET", f"/?token=wrong-{TOKEN}", host)[0] == 401
    assert _request(remote.port, "GET", f"/api/overview?token={TOKEN}", host)[0] == 401
    logged = caplog.text + "".join(str(record.args) for record in caplog.records)
    assert "GET /?token=*** " in caplog.text
    assert TOKEN not in logged


def test_the_cli_reads_the_token_from_a_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/dash.db"
    with sqlbroker.Broker(url) as broker:  # the dashboard, a read-only command, creates none
        broker.migrate()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLBROKER_")}
    env["SQLBROKER_URL"] = url
    script = str(Path(sys.executable).with_name("sqlbroker"))
    argv = [script, "dashboard", "--host", "0.0.0.0", "--port", "0", "--token-file"]
    process = subprocess.Popen([*argv, str(token_file)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        found = re.search(r" on http://\S+:(\d+)/", line)
        assert found, line
        port = int(found.group(1))
        headers = {"Host": f"dash.example:{port}", "Authorization": f"Bearer {TOKEN}"}
        deadline = time.monotonic() + 30
        while True:
            try:
                assert _request(port, "GET", "/api/overview", headers)[0] == 200
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert TOKEN not in line
    finally:
        process.terminate()
        process.communicate(timeout=30)  # also closes the pipe


@pytest.mark.parametrize(
    ("content", "extra", "needle"),
    [
        ("", [], "is empty"),
        (TOKEN, ["--token", TOKEN], "give the token once"),
        (None, [], "cannot read --token-file"),
    ],
    ids=["empty", "twice", "missing"],
)
def test_token_file_mistakes_are_one_line_exit_2(
    tmp_path: Path, content: str | None, extra: list[str], needle: str
) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    args = ["--url", f"sqlite:///{tmp_path}/x.db", "dashboard", "--token-file", str(token_file)]
    result = CliRunner(env={"SQLBROKER_DASHBOARD_TOKEN": None}).invoke(cli, [*args, *extra])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert TOKEN not in result.output
