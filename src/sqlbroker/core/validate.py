"""Validation of the scalar arguments every backend shares: durations, times, priorities,
headers and keys. Each check raises a :class:`ValidationError` subclass naming the field.
"""

from __future__ import annotations

import getpass
import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

from sqlbroker.core.errors import (
    InvalidDuration,
    InvalidHeaders,
    InvalidName,
    InvalidOption,
    InvalidPriority,
    InvalidTime,
)

MAX_DELAY = 10 * 366 * 86400.0
"""The longest delay or TTL accepted: ten years."""
MAX_LEASE = 24 * 3600.0
MAX_PRIORITY = 9
MAX_KEY_LENGTH = 255
MAX_HEADERS = 64
MAX_HEADER_NAME = 128
MAX_HEADER_VALUE = 4096
MAX_BATCH = 10_000
MAX_CLAIM = 1_000
MAX_ATTEMPTS = 1_000
MAX_REASON = 1_000
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def seconds(
    value: object,
    field: str,
    *,
    maximum: float = MAX_DELAY,
    allow_zero: bool = True,
) -> float:
    """Turn a duration (seconds or ``timedelta``) into finite, non-negative seconds."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            result = float(value)
        except OverflowError:  # an int beyond any float
            raise InvalidDuration(field, f"is longer than the limit of {maximum:g} s") from None
    else:
        raise InvalidDuration(field, f"must be seconds or a timedelta, not {type(value).__name__}")
    if not math.isfinite(result):
        raise InvalidDuration(field, f"must be finite, not {result!r}")
    if result < 0:
        raise InvalidDuration(field, f"must not be negative ({result!r} s)")
    if result == 0 and not allow_zero:
        raise InvalidDuration(field, "must be greater than zero")
    if result > maximum:
        raise InvalidDuration(field, f"{result!r} s is longer than the limit of {maximum:g} s")
    return result


def optional_seconds(value: object, field: str, *, maximum: float = MAX_DELAY) -> float | None:
    return None if value is None else seconds(value, field, maximum=maximum)


def lease_seconds(value: object, field: str = "lease") -> float:
    return seconds(value, field, maximum=MAX_LEASE, allow_zero=False)


def point_in_time(value: object, field: str) -> datetime:
    """An aware datetime within a sane range, normalised to UTC."""
    if not isinstance(value, datetime):
        raise InvalidTime(field, f"must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidTime(field, "must be timezone-aware (naive datetimes are ambiguous)")
    if not _EARLIEST <= value <= _LATEST:
        raise InvalidTime(field, f"{value.isoformat()} is out of range")
    return value.astimezone(UTC)


def priority(value: object, field: str = "priority") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidPriority(field, f"must be an integer 0–{MAX_PRIORITY}, not {value!r}")
    if not 0 <= value <= MAX_PRIORITY:
        raise InvalidPriority(field, f"must be 0–{MAX_PRIORITY} (0 is most urgent), not {value}")
    return int(value)


def flag(value: object, field: str) -> bool:
    """A switch: ``True`` or ``False`` only (not 0, 1 or ``"yes"``)."""
    if not isinstance(value, bool):
        raise InvalidOption(field, f"must be True or False, not {value!r}")
    return value


E = TypeVar("E", bound=Enum)


def member(value: object, kind: type[E], field: str) -> E:
    """One of an enumeration's members, given as the member or its value."""
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(str(item.value) for item in kind)
        raise InvalidOption(field, f"must be one of {known}, not {value!r}") from None


def integer(value: object, field: str, *, minimum: int, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidOption(field, f"must be an integer, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidOption(field, f"must be from {minimum} to {maximum}, not {value}")
    return int(value)


def items(value: object, field: str, what: str) -> list[Any]:
    """A list of arguments read from any iterable except ``str``, ``bytes`` and mappings
    (a string is not a list of its characters, nor a dict a list of its keys)."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidOption(field, f"must be a list of {what}, not {type(value).__name__}")
    return list(value)


def known_options(given: Iterable[str], known: Iterable[str], what: str) -> None:
    """Refuse keywords outside an option group (a ``**options`` parameter would otherwise
    swallow a misspelt one)."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        choices = ", ".join(sorted(known))
        raise InvalidOption(unknown[0], f"not a {what} option (the options: {choices})")


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text(value: object, field: str, *, maximum: int, printable: bool = False) -> str:
    """A non-empty string of at most ``maximum`` characters that both databases store as
    given: no NUL, no lone surrogate (valid UTF-8); ``printable`` also refuses control
    characters and line breaks."""
    if not isinstance(value, str) or not value or len(value) > maximum:
        raise InvalidOption(field, f"must be a non-empty string of at most {maximum} characters")
    if "\x00" in value or not _utf8(value) or (printable and not value.isprintable()):
        kind = "printable text" if printable else "valid text without NUL characters"
        raise InvalidOption(field, f"must be {kind}")
    return value


def name_text(value: object, field: str, maximum: int) -> str:
    """A non-empty string of at most ``maximum`` characters (a name or a key), or
    ``InvalidName``."""
    if not isinstance(value, str):
        raise InvalidName(field, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidName(field, "must not be empty")
    if len(value) > maximum:
        raise InvalidName(field, f"is {len(value)} characters long; the limit is {maximum}")
    return value


def key(value: object, field: str) -> str | None:
    """An ordering or idempotency key: a printable string of at most 255 characters."""
    if value is None:
        return None
    value = name_text(value, field, MAX_KEY_LENGTH)
    if not value.isprintable():  # neither NUL nor a lone surrogate is printable
        raise InvalidName(field, "must be printable Unicode text without control characters")
    return value


def required_key(value: object, field: str) -> str:
    """A :func:`key` that must be given: ``None`` is refused too."""
    checked = key(value, field)
    if checked is None:
        raise InvalidOption(field, "is required")
    return checked


def headers(value: object, field: str = "headers") -> dict[str, str] | None:
    """Headers: at most 64 entries of printable ``str`` names and ``str`` values."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidHeaders(field, f"must be a mapping of str to str, not {type(value).__name__}")
    if len(value) > MAX_HEADERS:
        raise InvalidHeaders(field, f"has {len(value)} entries; the limit is {MAX_HEADERS}")
    result: dict[str, str] = {}
    items: Any = value.items()
    for name, text in items:
        if not isinstance(name, str) or not name or len(name) > MAX_HEADER_NAME:
            raise InvalidHeaders(
                field,
                f"header names are non-empty strings of at most {MAX_HEADER_NAME} characters,"
                f" not {name!r}",
            )
        if not name.isascii() or not name.isprintable():
            raise InvalidHeaders(field, f"header name {name!r} must be printable ASCII")
        if not isinstance(text, str):
            raise InvalidHeaders(
                field, f"header {name!r} must be a string, not {type(text).__name__}"
            )
        if len(text) > MAX_HEADER_VALUE or "\x00" in text or not _utf8(text):
            raise InvalidHeaders(
                field,
                f"header {name!r} must be valid text without NUL,"
                f" at most {MAX_HEADER_VALUE} characters",
            )
        result[name] = text
    return result or None


def message_id(value: object, field: str = "message_id") -> str:
    """A message id (a UUID) in its canonical lowercase form."""
    if not isinstance(value, str) or len(value) > 64:
        raise InvalidName(field, f"must be a message id string, not {type(value).__name__}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidName(field, f"{value[:64]!r} is not a message id (a UUID)") from None


def reason(value: object, field: str = "reason") -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidOption(field, "must be a non-empty string")
    if "\x00" in value or not _utf8(value):
        raise InvalidOption(field, "must be valid text without NUL characters")
    return value[:MAX_REASON]


def actor(value: object) -> str:
    """Who an audited change is recorded for: the caller's ``actor`` (at most 200
    characters), or ``api:<login>`` of the process when it gives none."""
    if value is not None:
        return reason(value, "actor")[:200]
    try:
        return f"api:{getpass.getuser()}"
    except (KeyError, OSError):
        return "api"
