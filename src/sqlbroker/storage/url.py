"""Database URLs: parsing, and redaction so a password never reaches a log or an error.

Redaction lives here and only here. Free text (a driver's error, a log line, a request
line) goes through :func:`redact`; a URL sqlbroker holds is a :class:`DatabaseURL`, whose
``str`` and ``repr`` are redacted, and every error about a URL names it that way.

Passwords are read as generously as libpq could read them: in ``scheme://user:SECRET@host``
the secret runs from the first ``:`` to the *last* ``@`` of the URL, so a raw ``/``, ``?``,
``#`` or ``@`` in a password is hidden too (at worst more than the password is hidden).
``password=`` in a query or in a ``key=value`` connection string, and the dashboard's
``token=``, are hidden as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from sqlbroker.core.errors import InvalidURL

MASK = "***"
_SPACE = re.compile(r"\s")
_SCHEME = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://")
_QUERY_SECRET = re.compile(
    r"(?i)(?P<head>[?&](?:password|token)=)(?P<secret>.*?)(?=&[a-z_]+=|\s|$)"
)
_WHOLE_QUERY_SECRET = re.compile(
    r"(?is)(?P<head>[?&](?:password|token)=)(?P<secret>.*?)(?=&[a-z_]+=|$)"
)
_KEYWORD_SECRET = re.compile(
    r"(?i)(?<![?&\w])(?P<head>password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'?|\S+)"
)
_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_ENCODE_HINT = (
    "percent-encode '@', '/', '?', '#', ':', '&' and '%' in a user name or password"
    " (%40, %2F, %3F, %23, %3A, %26, %25)"
)


def _userinfo_secret(token: str, *, as_libpq: bool = False) -> tuple[int, int] | None:
    """Where the password of ``token`` (a URL without its scheme) lies: from the first
    ``:`` to the last ``@``, if there is a ``:`` before that ``@``. ``as_libpq``: to the
    first ``@`` when no ``/`` comes before it, as libpq reads it (exact once
    :func:`parse_url` has refused every URL the two readings disagree on)."""
    at = token.rfind("@")
    if as_libpq:
        at = token.find("@")
        slash = token.find("/")
        at = at if slash < 0 or at < slash else -1
    colon = token.find(":", 0, at) if at > 0 else -1
    if colon < 0 or at <= colon + 1:
        return None
    return colon + 1, at


def _secret_spans(text: str, *, whole: bool, as_libpq: bool = False) -> list[tuple[int, int]]:
    """Where the secrets of ``text`` lie: userinfo passwords of URLs (a URL ends at
    whitespace, unless ``whole`` says that all of ``text`` is one URL), ``password=`` and
    ``token=`` values. Found on the unmasked text, so one rule cannot hide another's."""
    spans: list[tuple[int, int]] = []
    for match in _SCHEME.finditer(text):
        start = match.end()
        end = len(text) if whole else _token_end(text, start)
        if "@" not in text[start:end] and ":" in text[start:end]:
            # Perhaps a password with a raw space: its '@' is further on.
            line_end = text.find("\n", start)
            end = len(text) if line_end < 0 else line_end
        span = _userinfo_secret(text[start:end], as_libpq=as_libpq)
        if span is not None:
            spans.append((start + span[0], start + span[1]))
    for pattern in (_WHOLE_QUERY_SECRET if whole else _QUERY_SECRET, _KEYWORD_SECRET):
        spans += [m.span("secret") for m in pattern.finditer(text) if m.group("secret")]
    return spans


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    out: list[str] = []
    position = 0
    for start, end in sorted(spans):
        if end <= position:
            continue
        if start > position:
            out.append(text[position:start])
        if not out or out[-1] != MASK:  # overlapping or touching spans: one mask
            out.append(MASK)
        position = end
    out.append(text[position:])
    return "".join(out)


def _token_end(text: str, start: int) -> int:
    space = _SPACE.search(text, start)
    return space.start() if space else len(text)


def redact(text: str) -> str:
    """``text`` with every password in a URL, every ``password=`` value (URL query or
    ``key=value`` connection string) and every ``token=`` query value replaced by ``***``."""
    return _masked(text, _secret_spans(text, whole=False))


def _secrets(url: str) -> list[str]:
    """Every stretch of ``url`` that may be (part of) a password, read generously."""
    found = [m.group("secret") for m in _WHOLE_QUERY_SECRET.finditer(url)]
    scheme = _SCHEME.match(url)
    rest = url[scheme.end() :] if scheme else url
    span = _userinfo_secret(rest)
    if span is not None:
        found.append(rest[span[0] : span[1]])
    return [secret for secret in found if secret]


def _scrub(text: str, secrets: list[str]) -> str:
    """:func:`redact`, and also hide any run of three or more characters (or a whole short
    secret) that ``text`` shares with one of ``secrets``, and any quoted text found inside
    one: a parser's message may quote a piece of a password it took for something else."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)  # whole copies first: the runs below stay short
    hidden = [False] * len(text)
    for quoted in re.finditer(r'"([^"]+)"', text):
        if any(quoted.group(1) in secret for secret in secrets):
            hidden[quoted.start(1) : quoted.end(1)] = [True] * len(quoted.group(1))
    for secret in secrets:
        shortest = min(3, len(secret))
        for start in range(len(text)):
            length = 0
            while start + length < len(text) and text[start : start + length + 1] in secret:
                length += 1
            if length >= shortest:
                hidden[start : start + length] = [True] * length
    out: list[str] = []
    for index, char in enumerate(text):
        if not hidden[index]:
            out.append(char)
        elif index == 0 or not hidden[index - 1]:
            out.append(MASK)
    return redact("".join(out))


@dataclass(frozen=True)
class DatabaseURL:
    scheme: str
    """``sqlite`` or ``postgresql``."""
    raw: str
    path: str | None = None
    """SQLite only: a filesystem path, or ``:memory:``."""

    def __repr__(self) -> str:
        return f"DatabaseURL({str(self)!r})"

    def __str__(self) -> str:
        return _masked(self.raw, _secret_spans(self.raw, whole=True, as_libpq=True))


def _shown(url: str) -> str:
    """``url``, which may not parse, as an error may show it."""
    spans = _secret_spans(url, whole=True)
    if _SCHEME.match(url) is None:
        span = _userinfo_secret(url)
        spans += [span] if span is not None else []
    return repr(_masked(url, spans))


def parse_url(url: object) -> DatabaseURL:
    """Check ``url`` and say which database it names. Every problem is an
    :class:`~sqlbroker.core.errors.InvalidURL` that shows the URL redacted."""
    if not isinstance(url, str) or not url:
        raise InvalidURL("the database URL must be a non-empty string")
    scheme, sep, _ = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise InvalidURL(
            f"not a database URL: {_shown(url)} (expected sqlite:///… or postgresql://…)"
        )
    scheme = scheme.lower()
    if scheme in _POSTGRES_SCHEMES:
        normalized = "postgresql" + url[len(scheme) :]
        _check_postgres(normalized)
        return DatabaseURL(scheme="postgresql", raw=normalized)
    if scheme == "sqlite":
        return _sqlite(url)
    raise InvalidURL(
        f"unsupported database {scheme!r} in {_shown(url)}: use sqlite:/// or postgresql://"
    )


def _check_postgres(url: str) -> None:
    """Refuse what libpq would misread or fail on later, with a reason that quotes no part
    of a password. libpq itself parses the URL (so multi-host URLs, ``?host=h1,h2`` and
    every libpq parameter mean what they mean to libpq); without psycopg installed the
    check is left to the backend, which then reports the missing extra."""
    try:
        from psycopg import Error as DriverError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # pragma: no cover - depends on the installed extras
        return
    secrets = _secrets(url)

    def refuse(reason: str) -> InvalidURL:
        return InvalidURL(f"malformed PostgreSQL URL {_shown(url)}: {_scrub(reason, secrets)}")

    rest = url[len("postgresql://") :]
    ends = [i for i in (rest.find("@"), rest.find("/")) if i >= 0]
    userinfo_end = rest.find("@") if ends and min(ends) == rest.find("@") else -1
    query = rest.find("?", userinfo_end + 1)
    if "@" in rest[userinfo_end + 1 : query if query >= 0 else len(rest)]:
        # libpq's user information ends at the first '@' or '/': a later '@' before the
        # query means a password (or a name) that libpq would split into host and path.
        raise refuse(f"'@' after the user information; {_ENCODE_HINT}")
    try:
        params = conninfo_to_dict(url)
    except DriverError as error:
        reason = " ".join(str(error).split()) + (f" ({_ENCODE_HINT})" if secrets else "")
        raise refuse(reason) from None
    except UnicodeDecodeError:  # psycopg decodes %xx escapes as UTF-8
        raise refuse(f"a percent-escape that is not UTF-8; {_ENCODE_HINT}") from None
    hosts = str(params.get("host") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    for port in ports:
        if port.strip() and not (port.strip().isdigit() and 0 < int(port) < 65536):
            hint = f"; {_ENCODE_HINT}" if secrets else ""
            raise refuse(f"port {port!r} is not a number from 1 to 65535{hint}")
    if len(ports) not in (1, len(hosts)):
        raise refuse(f"{len(ports)} ports for {len(hosts)} hosts (give one, or one per host)")


def _sqlite(url: str) -> DatabaseURL:
    rest = url[len("sqlite://") :]
    if not rest.startswith("/"):
        raise InvalidURL(
            f"SQLite URLs look like sqlite:///relative.db or sqlite:////abs.db, not {_shown(url)}"
        )
    location, _, query = rest[1:].partition("?")
    if query:
        # Refused rather than ignored: an ignored ?mode=ro would open the file read-write.
        raise InvalidURL(
            f"SQLite URLs take no options (got {redact('?' + query)}): sqlbroker opens"
            " the file read-write, so ?mode=ro and the like cannot be honoured; pass backend"
            " options as keyword arguments (busy_timeout=, synchronous=, pool_size=) and"
            " protect a file from writes with its permissions"
        )
    location = unquote(location)
    if "\x00" in location:
        raise InvalidURL("the SQLite URL's file name contains a NUL character")
    if not location:
        raise InvalidURL(
            "the SQLite URL names no file (use sqlite:///:memory: for a temporary database)"
        )
    return DatabaseURL(scheme="sqlite", raw=url, path=location)
