"""Database URLs on libpq's rules: passwords with raw URL delimiters are never printed (by
``Broker(...)``, by the CLI, by ``redact``), libpq's multi-host URLs connect for every
connection sqlbroker opens, and URL options sqlbroker cannot honour are refused."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sqlbroker
from sqlbroker.storage.url import parse_url, redact

# A password is written around one raw delimiter; neither half may ever be shown.
HALVES = ("hunter7", "swordfish9")
DELIMITERS = ["/", "?", "#", "@", ":", "&", "%", " ", "@x@"]


def _password(delimiter: str) -> str:
    return HALVES[0] + delimiter + HALVES[1]


def _assert_hidden(text: str) -> None:
    for half in HALVES:
        assert half not in text, text


def _said(error: BaseException) -> str:
    return "\n".join([str(error), repr(error), "".join(traceback.format_exception(error))])


def _open(url: str) -> sqlbroker.Broker | BaseException:
    """A broker, or the error its constructor raised (checked by the caller)."""
    try:
        return sqlbroker.Broker(url, connect_timeout=2)
    except sqlbroker.SqlbrokerError as error:
        return error


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _shapes(host: str, port: int, db: str, user: str) -> dict[str, str]:
    """Every way of writing a password into a URL, for every raw delimiter."""
    closed = _closed_port()
    shapes: dict[str, str] = {}
    for d in DELIMITERS:
        pw = _password(d)
        shapes[f"userinfo[{d}]"] = f"postgresql://{user}:{pw}@{host}:{port}/{db}"
        shapes[f"multihost[{d}]"] = (
            f"postgresql://{user}:{pw}@{host}:{closed},{host}:{port}/{db}"
            "?target_session_attrs=read-write"
        )
        shapes[f"query[{d}]"] = f"postgresql://{user}@{host}:{port}/{db}?password={pw}"
        shapes[f"query-hosts[{d}]"] = (
            f"postgresql://{user}@/{db}?host={host},{host}&port={closed},{port}&password={pw}"
        )
    return shapes


def _live_shapes() -> list[str]:
    return list(_shapes("h", 1, "db", "u"))


@pytest.mark.postgres
@pytest.mark.parametrize("shape", _live_shapes())
def test_a_password_with_raw_delimiters_is_never_shown_by_the_broker(
    shape: str, pg_url: str
) -> None:
    parts = urlsplit(pg_url)
    url = _shapes(parts.hostname or "", parts.port or 0, parts.path[1:], parts.username or "")[
        shape
    ]
    if not (shape.startswith("query") and shape.endswith("[ ]")):
        # In free text a query value ends at whitespace; libpq refuses a raw space anyway,
        # and sqlbroker never echoes a URL it holds unredacted (checked below).
        _assert_hidden(redact(url))
        _assert_hidden(redact(f"could not use {url!r}: broken"))
    broker = _open(url)
    if isinstance(broker, BaseException):
        # Refused before connecting: one line, the URL shown redacted.
        assert isinstance(broker, sqlbroker.InvalidURL), repr(broker)
        assert "\n" not in str(broker)
        _assert_hidden(_said(broker))
        return
    try:
        _assert_hidden(repr(broker) + broker.url + repr(broker.backend))
        try:
            broker.send("q", 1)  # trust authentication: a URL libpq reads connects
        except sqlbroker.SqlbrokerError as error:
            _assert_hidden(_said(error))
    finally:
        broker.close()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:hunter7/swordfish9@h/db",
        "postgresql://u:hunter7@swordfish9@h1:5432,h2:5433/db",
        "postgresql://u:hunter7%zzswordfish9@h/db",
        "postgresql://u:hunter7 swordfish9@h/db",
        "postgresql://u@h/db?password=hunter7&swordfish9",
        "postgresql://u:hunter7:swordfish9@h:notaport/db",
        "postgresql://u:hunter7@swordfish9@[::1/db",
        "mysql://u:hunter7/swordfish9@h/db",
        "u:hunter7/swordfish9@h/db",
        "host=h password='hunter7 swordfish9'",
        "mysql://x",
    ],
)
def test_a_malformed_url_is_one_redacted_line(url: str) -> None:
    with pytest.raises(sqlbroker.InvalidURL) as caught:
        sqlbroker.Broker(url)
    assert isinstance(caught.value, sqlbroker.ConfigurationError)
    assert "\n" not in str(caught.value)
    _assert_hidden(_said(caught.value))


def test_redact_reads_passwords_the_way_libpq_could() -> None:
    assert redact("postgresql://u:SEC/RET@h/db") == "postgresql://u:***@h/db"
    assert redact("postgresql://u:SEC@RET@h:1,h2:2/db") == "postgresql://u:***@h:1,h2:2/db"
    assert redact("'postgresql://leaky:Pa?ss#wo1rd@h/db'") == "'postgresql://leaky:***@h/db'"
    assert redact("host=h password='a b\\'c' dbname=x") == "host=h password=*** dbname=x"
    assert redact("postgresql://u@h/db?password=a&b&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )
    assert redact("GET /?token=abcdefghijklmnop HTTP/1.1") == "GET /?token=*** HTTP/1.1"
    # A URL that parses is shown exactly: an '@' in a query is no password.
    shown = "postgresql://u@h:5432/db?application_name=a@b"
    assert str(parse_url(shown)) == shown
    assert str(parse_url("postgresql://leaky:Pa?ss#wo1rd@h/db")) == "postgresql://leaky:***@h/db"


def _cli(url: str, *args: str, via_env: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLBROKER_")}
    env["NO_COLOR"] = "1"
    argv = [str(Path(sys.executable).with_name("sqlbroker"))]
    if via_env:
        env["SQLBROKER_URL"] = url
    else:
        argv += ["--url", url]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.mark.postgres
@pytest.mark.parametrize("delimiter", DELIMITERS)
def test_the_cli_never_prints_a_password_with_raw_delimiters(delimiter: str, pg_url: str) -> None:
    parts = urlsplit(pg_url)
    shapes = _shapes(parts.hostname or "", parts.port or 0, parts.path[1:], parts.username or "")
    commands = [
        (["stats"], False),
        (["migrate"], True),
        (["dashboard", "--host", "0.0.0.0", "--port", "1"], True),  # refused: no token
        (["send", "q", "1"], False),
    ]
    selected = [url for name, url in shapes.items() if name.endswith(f"[{delimiter}]")]
    for url, (args, via_env) in zip(selected, commands, strict=True):
        result = _cli(url, *args, via_env=via_env)
        _assert_hidden(result.stdout + result.stderr)
        if result.returncode != 0:
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        if "url: " in result.stderr:
            assert result.returncode == 2, (url, args, result.stderr)


def test_sqlite_url_options_are_refused_not_ignored(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    with pytest.raises(sqlbroker.InvalidURL, match=r"SQLite URLs take no options \(got \?mode=ro"):
        sqlbroker.Broker(f"sqlite:///{path}?mode=ro")
    assert not path.exists(), "nothing was opened"
    result = _cli(f"sqlite:///{path}?mode=ro", "send", "q", "1", via_env=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: url: SQLite URLs take no options")
    assert not path.exists()


# --- multi-host URLs: the first host down, the second up -------------------------------------


def _multi_host_urls(pg_url: str) -> list[str]:
    parts = urlsplit(pg_url)
    host, port, closed = parts.hostname, parts.port, _closed_port()
    user, db = parts.username, parts.path[1:]
    return [
        f"postgresql://{user}@{host}:{closed},{host}:{port}/{db}?target_session_attrs=read-write",
        f"postgresql://{user}@/{db}?host={host},{host}&port={closed},{port}"
        "&target_session_attrs=read-write",
    ]


@pytest.mark.postgres
@pytest.mark.parametrize("form", [0, 1], ids=["hosts-in-authority", "hosts-in-query"])
def test_a_multi_host_url_connects_past_a_dead_first_host(form: int, pg_url: str) -> None:
    url = _multi_host_urls(pg_url)[form]
    with sqlbroker.Broker(url, connect_timeout=2) as broker:  # the sync pool
        broker.send("q", {"n": 1})
        (delivery,) = broker.claim("q")
        broker.complete(delivery)
        backend = broker.backend

        async def async_pool_and_listener() -> list[str | None]:
            hints: list[str | None] = []
            woken = asyncio.Event()

            def on_hint(payload: str | None) -> None:
                hints.append(payload)
                if payload is not None:
                    woken.set()

            listening = asyncio.ensure_future(backend.listen_async(on_hint=on_hint))
            try:
                while not hints:  # the listener connected and asked for a first poll
                    await asyncio.sleep(0.01)
                broker.send("q", {"n": 2})
                await asyncio.wait_for(woken.wait(), 30)
                claimed = await backend.async_ops.message_claim_many(  # the async pool
                    subscription="q", limit=10, lease=30.0, worker=None
                )
                assert [d.payload for d in claimed] == [{"n": 2}]
            finally:
                listening.cancel()
                await asyncio.wait([listening])
                await backend.close_async()
            return hints

        hints = asyncio.run(async_pool_and_listener())
    assert "q" in hints, hints


_PASSWORD_TEXT = st.text(alphabet="abcXYZ019/?#@:&%=' ", min_size=1, max_size=24)


@settings(max_examples=300, deadline=None)
@given(password=_PASSWORD_TEXT, form=st.sampled_from(["userinfo", "multihost", "query"]))
def test_no_password_is_shown_whatever_it_contains(password: str, form: str) -> None:
    """Every password, raw delimiters and all: the URL is shown (``str``) or refused
    (``InvalidURL``) without it; the marks around it make it unique in the URL."""
    secret = f"Q{password}Q"
    url = {
        "userinfo": f"postgresql://u:{secret}@h:5432/db",
        "multihost": f"postgresql://u:{secret}@h1:5432,h2:5433/db?target_session_attrs=any",
        "query": f"postgresql://u@h/db?password={secret}&sslmode=disable",
    }[form]
    try:
        shown = str(parse_url(url))
    except sqlbroker.InvalidURL as error:
        shown = _said(error)
    assert secret not in shown
    assert secret not in redact(url)
