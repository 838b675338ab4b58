"""A password in a PostgreSQL URL never shows up in a repr, a URL property or an error."""

from __future__ import annotations

import socket
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
        for operation in (broker.stats, lambda: broker.backend, lambda: broker.send("q", 1)):
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
