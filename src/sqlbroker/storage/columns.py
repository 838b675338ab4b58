"""The decoding home: converters from stored column values to Python values, and
:class:`Columns`, which reads a row through them without ever raising.

Stored rows can be damaged: a superuser, a raw-SQL script or an older version may have
written headers that are not a JSON object of strings, text where a number belongs (SQLite
keeps whatever it is given), a time PostgreSQL calls ``infinity``, or JSON columns that do
not parse. A converter raises ``ValueError`` saying what is wrong; :meth:`Columns.get` turns
that into a stand-in value and a note naming the column (the row's ``damaged`` text).
:func:`record_of` decodes a row into a record dataclass field by field, each by its
annotated type (:data:`_BY_TYPE`); the row decoders in :mod:`sqlbroker.storage.rows` and
the operations are written on top of it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from sqlbroker.core.message import Outcome, State
from sqlbroker.core.observability import HANDLER_BUCKETS
from sqlbroker.core.sagas import SagaStatus, StepStatus
from sqlbroker.core.schedules import Missed
from sqlbroker.core.serde import decode_payload

T = TypeVar("T")
R = TypeVar("R")

EPOCH = datetime.fromtimestamp(0, UTC)
"""The stand-in for a time column that does not decode."""
POSITIVE_INFINITY = datetime.max.replace(tzinfo=UTC)
NEGATIVE_INFINITY = datetime.min.replace(tzinfo=UTC)
"""PostgreSQL's ``infinity`` and ``-infinity`` as the driver loads them: a damaged time."""


def utc(value: Any) -> datetime:
    """A database time (aware datetime or Unix seconds) as an aware UTC datetime."""
    if isinstance(value, datetime):
        if value is POSITIVE_INFINITY or value is NEGATIVE_INFINITY:
            raise ValueError("is infinity, not a time")
        return value.astimezone(UTC)
    if value is None or isinstance(value, bool | str | bytes | bytearray | memoryview):
        raise ValueError(f"is {kind(value)}, not a time")
    return datetime.fromtimestamp(float(value), UTC)


def utc_or_none(value: Any) -> datetime | None:
    return None if value is None else utc(value)


def kind(value: Any) -> str:
    """A short description of a stored value for a ``damaged`` text (never the value
    itself: it may be long, or private)."""
    if value is None:
        return "NULL"
    if isinstance(value, str | bytes | bytearray | memoryview):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def decode_headers(text: Any) -> dict[str, str]:
    """Stored headers: JSON text of an object whose values are strings (empty or NULL: no
    headers). Raises ``ValueError`` saying what is wrong otherwise."""
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        raise ValueError(f"is {kind(text)}, not JSON text")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"is a JSON {type(value).__name__}, not an object")
    if not all(type(item) is str for item in value.values()):
        raise ValueError("has a value that is not a string")
    return value


def headers_of(text: Any) -> dict[str, str]:
    """Stored headers, or no headers when they do not decode (:func:`decode_headers`)."""
    try:
        return decode_headers(text)
    except ValueError:
        return {}


def payload_bytes(data: Any) -> bytes:
    """A stored payload's bytes (SQLite may hand back text a raw statement wrote)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8", "surrogateescape")
    raise ValueError(f"is {kind(data)}, not bytes")


def text(value: Any) -> str:
    """Converters for :meth:`Columns.get`: each returns the value or raises ``ValueError``."""
    if not isinstance(value, str):
        raise ValueError(f"is {kind(value)}, not text")
    return value


def text_or_none(value: Any) -> str | None:
    return None if value is None else text(value)


def integer(value: Any) -> int:
    if type(value) is int:
        return value
    if isinstance(value, float | Decimal) and math.isfinite(value) and value == int(value):
        return int(value)
    raise ValueError(f"is {kind(value)}, not an integer")


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError(f"is {kind(value)}, not a number")
    return float(value)


def number_or_none(value: Any) -> float | None:
    return None if value is None else number(value)


def uuid_text(value: Any) -> str:
    if value is None:
        raise ValueError("is NULL")
    return str(value)


def json_text(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError(f"is {kind(value)}, not JSON text")
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        raise ValueError("is not JSON") from None


def json_text_or_none(value: Any) -> Any:
    return None if value is None else json_text(value)


def strings(value: Any) -> tuple[str, ...]:
    items = json_text(value)
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ValueError("is not a JSON list of strings")
    return tuple(items)


def buckets(value: Any) -> list[int]:
    items = json_text(value)
    if (
        not isinstance(items, list)
        or len(items) > len(HANDLER_BUCKETS)
        or not all(type(n) is int and n >= 0 for n in items)
    ):
        raise ValueError("is not a JSON list of counts")
    return items


def json_object(value: Any) -> dict[str, object]:
    found = json_text(value)
    if not isinstance(found, dict):
        raise ValueError(f"is a JSON {type(found).__name__}, not an object")
    return found


class Columns:
    """One row's columns, each decoded by a converter that raises on a bad value; a column
    that does not decode yields ``stand_in`` and is recorded in :attr:`damaged`.

    ``row`` is a mapping (columns by name) or a sequence with ``names`` giving its columns'
    names in order."""

    __slots__ = ("_names", "_problems", "_row")

    def __init__(self, row: Any, names: Sequence[str] | None = None) -> None:
        self._row = row
        self._names = names
        self._problems: list[str] = []

    def raw(self, column: str) -> Any:
        if self._names is None:
            return self._row[column]
        return self._row[self._names.index(column)]

    def get(self, column: str, convert: Callable[[Any], T], stand_in: T) -> T:
        try:
            return convert(self.raw(column))
        except Exception as error:  # a converter's ValueError, or anything a value caused
            self.note(column, str(error) or type(error).__name__)
            return stand_in

    def note(self, column: str, problem: str) -> None:
        self._problems.append(f"{column} {problem}")

    @property
    def damaged(self) -> str | None:
        """What did not decode (``"headers is a JSON list, not an object"``), or ``None``."""
        return "; ".join(self._problems) or None


def payload_column(columns: Columns) -> Any:
    """The payload decoded by its content type (JSON that does not parse stays bytes, see
    :func:`~sqlbroker.core.serde.decode_payload`)."""
    content_type = columns.raw("content_type")  # its own field says when it does not decode
    if not isinstance(content_type, str):
        content_type = ""
    return columns.get(
        "payload", lambda data: decode_payload(payload_bytes(data), content_type), b""
    )


_BY_TYPE: dict[Any, tuple[Callable[[Any], Any], Any]] = {
    str: (text, ""),
    str | None: (text_or_none, None),
    int: (integer, 0),
    float: (number, 0.0),
    float | None: (number_or_none, None),
    bool: (bool, False),
    bytes: (payload_bytes, b""),
    datetime: (utc, EPOCH),
    datetime | None: (utc_or_none, None),
    dict[str, str]: (decode_headers, {}),
    dict[str, object]: (json_object, {}),
    tuple[str, ...]: (strings, ()),
    list[int]: (buckets, []),
    State: (State, State.AVAILABLE),
    Outcome: (Outcome, Outcome.COMPLETED),
    SagaStatus: (SagaStatus, SagaStatus.FAILED),
    StepStatus: (StepStatus, StepStatus.PENDING),
    Missed: (Missed, Missed.LATEST),
}
"""How a record's field decodes by its annotated type: the converter, and the stand-in
when the column does not decode."""

_BY_FIELD: dict[tuple[str, Any], tuple[Callable[[Any], Any], Any]] = {
    ("message_id", str): (uuid_text, ""),
    ("lease_token", str): (uuid_text, ""),
    ("seen_age", float): (number, math.inf),
    ("data", Any): (json_text_or_none, None),
    ("output", Any): (json_text_or_none, None),
}
"""Fields whose column is read otherwise than their type says (PostgreSQL's ``uuid``
columns load as ``UUID``; a worker whose age does not decode was seen never)."""

_COLUMN = {
    "key": "ordering_key",
    "attempt": "attempts",
    "index": "idx",
    "every": "every_seconds",
    "grace": "grace_seconds",
    "ttl": "ttl_seconds",
}
"""The column of a field not named after it."""


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, str, Callable[[Any], Any] | None, Any], ...]:
    """Each field of ``cls`` but ``damaged``: its name, its column, its converter and
    stand-in (no converter: the caller reads the field)."""
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        if field.name != "damaged":
            hint = hints[field.name]
            convert, stand_in = (
                _BY_FIELD.get((field.name, hint)) or _BY_TYPE.get(hint) or (None, None)
            )
            found.append((field.name, _COLUMN.get(field.name, field.name), convert, stand_in))
    return tuple(found)


def record_of(cls: type[R], columns: Columns, **read: Callable[[Columns], Any]) -> R:
    """A ``cls`` (a record dataclass) of the row ``columns`` reads, never raising: each
    field in the order declared, by ``read[field](columns)`` when given, else from its
    column by its type (:data:`_BY_TYPE`); then ``damaged``, when ``cls`` has one, naming
    every column that did not decode."""
    values = {
        name: read[name](columns)
        if convert is None or name in read
        else columns.get(column, convert, stand_in)
        for name, column, convert, stand_in in _fields(cls)  # type: ignore[arg-type]
    }
    if "damaged" in cls.__dataclass_fields__:  # type: ignore[attr-defined]
        values["damaged"] = columns.damaged
    return cls(**values)
