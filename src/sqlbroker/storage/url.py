"""Database URLs: parsing, and redaction so a password never reaches a log or an error."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from sqlbroker.core.errors import ConfigurationError

_PASSWORD = re.compile(r"(?P<head>://[^:/@?#]*:)(?P<secret>[^@/?#]*)(?P<tail>@)")
_QUERY_PASSWORD = re.compile(r"(?i)(?P<head>[?&]password=)(?P<secret>[^&#]*)")


def redact(text: str) -> str:
    """Replace every password in URLs or ``password=`` parameters inside ``text``."""
    text = _PASSWORD.sub(lambda m: m.group("head") + "***" + m.group("tail"), text)
    text = _QUERY_PASSWORD.sub(lambda m: m.group("head") + "***", text)
    return re.sub(r"(?i)(password\s*=\s*)('[^']*'|\S+)", r"\1***", text)


@dataclass(frozen=True)
class DatabaseURL:
    scheme: str
    """``sqlite`` or ``postgresql``."""
    raw: str
    path: str | None = None
    """SQLite only: a filesystem path, or ``:memory:``."""
    options: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return f"DatabaseURL({redact(self.raw)!r})"

    def __str__(self) -> str:
        return redact(self.raw)


def parse_url(url: object) -> DatabaseURL:
    if not isinstance(url, str) or not url:
        raise ConfigurationError("the database URL must be a non-empty string")
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"not a database URL: {redact(url)!r} (expected sqlite:///… or postgresql://…)"
        )
    scheme = scheme.lower()
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError as error:
            raise ConfigurationError(
                f"malformed PostgreSQL URL {redact(url)!r}: {redact(str(error))}"
            ) from None
        normalized = "postgresql" + url[len(scheme) :]
        return DatabaseURL(scheme="postgresql", raw=normalized)
    if scheme == "sqlite":
        rest = url[len("sqlite://") :]
        if not rest.startswith("/"):
            raise ConfigurationError(
                f"SQLite URLs look like sqlite:///relative.db or sqlite:////abs.db, not {url!r}"
            )
        location, _, query = rest[1:].partition("?")
        location = unquote(location)
        if "\x00" in location:
            raise ConfigurationError("the SQLite URL's file name contains a NUL character")
        if not location:
            raise ConfigurationError(
                "the SQLite URL names no file (use sqlite:///:memory: for a temporary database)"
            )
        return DatabaseURL(scheme="sqlite", raw=url, path=location, options=tuple(parse_qsl(query)))
    raise ConfigurationError(f"unsupported database {scheme!r}: use sqlite:/// or postgresql://")
