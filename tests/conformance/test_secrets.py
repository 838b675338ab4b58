"""A password in a PostgreSQL URL never shows up in a repr, a URL property, an error, a log
line, a metric, a dashboard response or the CLI's output; payloads are not logged."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import traceback
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import sqlbroker

SECRET = "s3cr3t-Pa55word"


def _everything_said(error: BaseException) -> str:
    """The error as a user would see it: str, repr and the full printed traceback chain."""
    return "\n".join([str(error), repr(error), "".join(traceback.format_exception(error))])


def _open(url: str, **options: Any) -> sqlbroker.Broker | Exception:
    """A broker, or the exception its constructor raised (checked by the caller)."""
    try:
        return sqlbroker.Broker(url, **options)
    except Exception as error:
        return error


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _with_password(url: str, password: str = SECRET) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://user:{SECRET}@127.0.0.1:1/db",
        f"postgres://user:{SECRET}@127.0.0.1:1/db?sslmode=disable",
        f"postgresql://user@127.0.0.1:1/db?password={SECRET}",
        f"postgresql://user:{SECRET}@127.0.0.1:notaport/db",
        f"postgresql://user:{SECRET}@[::1/db",
        f"mysql://user:{SECRET}@127.0.0.1/db",
        f"postgresql+psycopg://user:{SECRET}@127.0.0.1:1/db",
    ],
    ids=[
        "userinfo",
        "short-scheme",
        "query-password",
        "bad-port",
        "bad-host",
        "unknown-scheme",
        "dialect",
    ],
)
def test_bad_or_unreachable_url_never_reveals_the_password(url: str) -> None:
    url = url.replace(":1/", f":{_closed_port()}/")
    broker = _open(url, connect_timeout=2)
    if isinstance(broker, BaseException):
        assert isinstance(broker, sqlbroker.SqlbrokerError), repr(broker)
        assert SECRET not in _everything_said(broker)
        return
    try:
        assert SECRET not in repr(broker)
        assert SECRET not in broker.url
        for operation in (broker.stats, broker.schema_version, lambda: broker.send("q", 1)):
            with pytest.raises(sqlbroker.SqlbrokerError) as caught:
                operation()
            assert SECRET not in _everything_said(caught.value)
    finally:
        broker.close()


@pytest.mark.postgres
def test_live_postgres_broker_never_reveals_the_password(pg_url: str) -> None:
    url = _with_password(pg_url)
    with sqlbroker.Broker(url, migrate=True) as broker:
        broker.send("q", 1)  # trust auth ignores the password, so this connects
        assert SECRET not in repr(broker)
        assert SECRET not in broker.url
        assert "***" in broker.url
        assert SECRET not in repr(broker.backend)
    missing = url.rsplit("/", 1)[0] + "/no_such_database"
    other = _open(missing, connect_timeout=5)
    if isinstance(other, BaseException):
        assert isinstance(other, sqlbroker.SqlbrokerError), repr(other)
        assert SECRET not in _everything_said(other)
        return
    try:
        with pytest.raises(sqlbroker.SqlbrokerError) as caught:
            other.stats()
        assert SECRET not in _everything_said(caught.value)
        assert SECRET not in repr(other)
    finally:
        other.close()


def test_async_repr_hides_the_password(tmp_path: object) -> None:
    """The async face wraps the sync one; its repr goes through the same redaction."""
    broker = sqlbroker.AsyncBroker(f"sqlite:///{tmp_path}/x.db")
    try:
        assert repr(broker).startswith("AsyncBroker(")
    finally:
        import asyncio

        asyncio.run(broker.close())


# --- everything a running deployment says ---------------------------------------------------

PAYLOAD_MARKER = "card-4111-1111-1111-1111"


def _secret_url(backend_url: str) -> str:
    """The test database's URL with a password in it where the backend has one (trust
    authentication ignores it, so the broker still connects)."""
    return backend_url if backend_url.startswith("sqlite") else _with_password(backend_url)


def test_a_worker_run_logs_no_password_and_no_payload(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = _secret_url(backend_url)
    app = sqlbroker.app.Broker(url, migrate=True, lease=30)

    @app.subscriber(queue="charges", retry=sqlbroker.RetryPolicy(max_attempts=2, base=0.01))
    def charge(message: Any) -> None:
        if message.payload["fail"]:
            raise ValueError("the card was declined")

    try:
        app.send("charges", {"card": PAYLOAD_MARKER, "fail": False})
        app.send("charges", {"card": PAYLOAD_MARKER, "fail": True})
        app.run_until_idle(timeout=60)
        assert len(app.dead_letters.list()) == 1
        said = [repr(app), app.url, repr(app.backend)]
    finally:
        app.close()
    text = (
        caplog.text + "\n".join(said) + "".join(str(record.__dict__) for record in caplog.records)
    )
    assert "dead-lettered" in caplog.text, "the run logged its outcomes"
    assert SECRET not in text
    assert PAYLOAD_MARKER not in text, "payloads are not logged by default"


def test_json_logs_carry_no_payload(backend_url: str, caplog: pytest.LogCaptureFixture) -> None:
    from sqlbroker.interfaces.logs import JsonFormatter

    caplog.set_level(logging.DEBUG)
    app = sqlbroker.app.Broker(_secret_url(backend_url), migrate=True)

    @app.subscriber(queue="q", retry=sqlbroker.RetryPolicy(max_attempts=1))
    def handle(message: Any) -> None:
        raise sqlbroker.Reject("refused")

    try:
        app.send("q", {"secret": PAYLOAD_MARKER})
        app.run_until_idle(timeout=60)
    finally:
        app.close()
    formatted = "\n".join(JsonFormatter().format(record) for record in caplog.records)
    assert PAYLOAD_MARKER not in formatted
    assert SECRET not in formatted


@pytest.mark.postgres
def test_connection_failures_log_no_password(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    dead_port = _with_password(pg_url).replace(f":{urlsplit(pg_url).port}/", f":{_closed_port()}/")
    broker = sqlbroker.Broker(dead_port, connect_timeout=1)
    try:
        with pytest.raises(sqlbroker.ConnectionLost) as caught:
            broker.send("q", 1)
        assert SECRET not in _everything_said(caught.value)
        stop = threading.Event()
        listener = threading.Thread(target=_listen_briefly, args=(broker, stop), daemon=True)
        listener.start()
        deadline = time.monotonic() + 30
        while "LISTEN connection lost" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        listener.join(10)
    finally:
        broker.close()
    assert "LISTEN connection lost" in caplog.text
    assert SECRET not in caplog.text
    assert SECRET not in "".join(str(record.args) for record in caplog.records)


def _listen_briefly(broker: sqlbroker.Broker, stop: threading.Event) -> None:
    """The LISTEN loop of a backend that cannot connect: it logs its reconnects."""
    import asyncio

    from sqlbroker.storage.factory import open_backend

    backend = open_backend(broker._url.raw, connect_timeout=1)

    async def listen_until_stop() -> None:
        listener = asyncio.ensure_future(backend.listen_async(on_hint=lambda _: None))
        while not stop.is_set():
            await asyncio.sleep(0.05)
        listener.cancel()
        await asyncio.wait([listener])

    try:
        asyncio.run(listen_until_stop())
    finally:
        backend.close()


@pytest.mark.postgres
def test_reprs_of_brokers_and_backends_hide_the_password(pg_url: str) -> None:
    import asyncio

    url = _with_password(pg_url)
    for made in (
        sqlbroker.Broker(url),
        sqlbroker.app.Broker(url),
    ):
        try:
            assert SECRET not in repr(made)
            assert SECRET not in repr(made.backend)
            assert SECRET not in made.url
        finally:
            made.close()
    async_broker = sqlbroker.AsyncBroker(url)
    try:
        assert SECRET not in repr(async_broker)
        assert SECRET not in repr(async_broker)
    finally:
        asyncio.run(async_broker.close())


def test_prometheus_exposition_and_dashboard_carry_no_password(backend_url: str) -> None:
    from sqlbroker.interfaces.dashboard.api import Api
    from sqlbroker.interfaces.prometheus import exposition, registry_for

    with sqlbroker.Broker(_secret_url(backend_url), migrate=True) as broker:
        broker.send("q", {"card": PAYLOAD_MARKER})
        text = exposition(registry_for(broker)).decode()
        overview = json.dumps(Api(broker).overview(), default=str)
    assert 'subscription="q"' in text
    assert SECRET not in text
    assert SECRET not in overview
    assert PAYLOAD_MARKER not in text


@pytest.mark.parametrize("live", [True, False], ids=["reachable", "unreachable"])
def test_the_cli_never_prints_the_password(live: bool, backend_url: str) -> None:
    from click.testing import CliRunner

    from sqlbroker.interfaces.cli import cli

    if backend_url.startswith("sqlite"):
        if live:
            pytest.skip("SQLite URLs carry no password")
        url = f"postgresql://app:{SECRET}@127.0.0.1:{_closed_port()}/db?connect_timeout=1"
    else:
        url = _with_password(backend_url)
        if not live:
            url = url.replace(f":{urlsplit(backend_url).port}/", f":{_closed_port()}/")
    runner = CliRunner(env={"SQLBROKER_URL": None})
    for args in (["stats"], ["migrate"], ["schema"], ["send", "q", "1"], ["roles", "show"]):
        result = runner.invoke(cli, ["--url", url, *args])
        assert SECRET not in result.output, (args, result.output)
        if not live:
            assert result.exit_code == 1, (args, result.output)
            assert result.output.startswith("error:")
