"""Payload encoding: strict JSON (or raw bytes with a content type), never pickle.

A JSON payload is checked value by value before it is encoded, so that what a consumer
decodes is exactly what the producer passed: only ``None``, ``bool``, ``int``, finite
``float``, ``str`` (no NUL, no lone surrogate), ``list``/``tuple`` and ``dict`` with string
keys are accepted.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from sqlbroker.core.errors import InvalidOption, InvalidPayload

JSON_CONTENT_TYPE = "application/json"
BYTES_CONTENT_TYPE = "application/octet-stream"
DEFAULT_PAYLOAD_LIMIT = 256 * 1024
HARD_PAYLOAD_LIMIT = 1024 * 1024
MAX_DEPTH = 64
_MAX_CONTENT_TYPE = 255

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encoder = (
    None
    if _make_c_encoder is None
    else _make_c_encoder(
        None, _encoder.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
)


def _checked_json(value: Any) -> bytes:
    """``_encoder``'s encoding of a value already checked (:func:`_plain` or
    :func:`_check_value`), as UTF-8: through one C encoder made once, where
    ``JSONEncoder.encode`` makes one per call (a third of a small payload's encoding). It
    skips the check for circular references, which the depth limit of those checks has
    refused already."""
    if _c_encoder is None:
        return _encoder.encode(value).encode("utf-8")
    return "".join(_c_encoder(value, 0)).encode("utf-8")


def _check_string(value: str, field: str, where: str) -> None:
    if "\x00" in value:
        raise InvalidPayload(field, f"{where} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(
            field, f"{where} contains a lone surrogate (not valid Unicode)"
        ) from None


_BYTES_HINT = " (use bytes for raw data)"


def _check_value(value: Any, field: str, where: str, depth: int, hint: str = _BYTES_HINT) -> None:
    if depth > MAX_DEPTH:
        raise InvalidPayload(field, f"nests deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, int):  # bool among the ints
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidPayload(field, f"{where} is {value!r}; JSON has no NaN or infinity")
        return
    if isinstance(value, str):
        _check_string(value, field, where)
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_value(item, field, f"{where}[{index}]", depth + 1, hint)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(
                    field, f"{where} has a key of type {type(key).__name__}; JSON keys are strings"
                )
            _check_string(key, field, f"a key in {where}")
            _check_value(item, field, f"{where}[{key!r}]", depth + 1, hint)
        return
    raise InvalidPayload(field, f"{where} is a {type(value).__name__}, which is not JSON{hint}")


def _plain(value: Any, depth: int) -> bool:
    """The fast path: is ``value`` plain JSON? Builds no messages; a ``False`` sends the
    payload through :func:`_check_value` to say what is wrong. Strings are checked for NUL
    only: a lone surrogate fails the UTF-8 encoding of the whole document. The scalars of
    a container are checked in its loop, without a call each."""
    if depth > MAX_DEPTH:
        return False
    kind = type(value)
    items: Iterable[Any]
    if kind is dict:
        for key in value:
            if type(key) is not str or "\x00" in key:
                return False
        items = value.values()
    elif kind is list or kind is tuple:
        items = value
    elif kind is str:
        return "\x00" not in value
    elif kind is float:
        return math.isfinite(value)
    else:
        return value is None or kind is bool or kind is int  # subclasses: the full check
    if depth == MAX_DEPTH:
        return not value  # an item would nest one level too deep
    for item in items:
        kind = type(item)
        if kind is str:
            if "\x00" in item:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif not (item is None or kind is bool or kind is int or _plain(item, depth + 1)):
            return False
    return True


def _refuse_constant(name: str) -> Any:
    raise InvalidPayload("payload", f"has {name}; JSON has no NaN or infinity")


def _check_json_bytes(data: bytes, field: str) -> None:
    """Bytes labelled JSON must hold a document :func:`encode_payload` would have accepted as
    a value: strict UTF-8, standard JSON (no NaN or infinity), and values that pass the
    same checks (no NUL, no lone surrogate, at most :data:`MAX_DEPTH` levels) — otherwise
    the claim that decodes it would be the first to find out."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidPayload(
            field, f"is labelled {JSON_CONTENT_TYPE} but is not UTF-8 ({error.reason})"
        ) from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except InvalidPayload as error:
        raise InvalidPayload(field, error.problem) from None
    except RecursionError:
        raise InvalidPayload(field, f"nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # not JSON, or an integer beyond Python's digit limit
        raise InvalidPayload(
            field, f"is labelled {JSON_CONTENT_TYPE} but is not JSON: {error}"
        ) from None
    _check_value(value, field, "the payload", 0)


def check_payload_limit(limit: object) -> int:
    """Validate a configured payload size limit (bytes)."""
    if (
        not isinstance(limit, int)
        or isinstance(limit, bool)
        or not 1 <= limit <= HARD_PAYLOAD_LIMIT
    ):
        raise InvalidOption(
            "payload_limit",
            f"must be an integer from 1 to {HARD_PAYLOAD_LIMIT} bytes, not {limit!r}",
        )
    return limit


def encode_payload(
    payload: Any,
    *,
    content_type: str | None = None,
    limit: int = DEFAULT_PAYLOAD_LIMIT,
    field: str = "payload",
) -> tuple[bytes, str]:
    """Encode a payload to ``(bytes, content_type)`` or raise :class:`InvalidPayload`.

    ``bytes``/``bytearray``/``memoryview`` pass through unchanged with ``content_type``
    (default ``application/octet-stream``); labelled ``application/json`` they must hold a
    JSON document that passes the same checks as a JSON value (strict UTF-8, no NaN or
    infinity, no NUL, no lone surrogate, at most 64 levels). Anything else must be plain
    JSON.
    """
    if content_type is not None and (
        not isinstance(content_type, str)
        or not content_type
        or len(content_type) > _MAX_CONTENT_TYPE
        or not content_type.isprintable()
        or not content_type.isascii()
    ):
        raise InvalidPayload(
            "content_type", f"must be a short printable ASCII string, not {content_type!r}"
        )
    if isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
        kind = content_type or BYTES_CONTENT_TYPE
        if kind == JSON_CONTENT_TYPE and len(data) <= limit:
            _check_json_bytes(data, field)
    else:
        if content_type is not None and content_type != JSON_CONTENT_TYPE:
            raise InvalidPayload(
                "content_type",
                f"{content_type!r} needs a bytes payload; JSON values are {JSON_CONTENT_TYPE}",
            )
        data = _encode_value(payload, field, "the payload", _BYTES_HINT)
        kind = JSON_CONTENT_TYPE
    _check_size(data, field, limit)
    return data, kind


def encode_value(value: Any, *, limit: int = DEFAULT_PAYLOAD_LIMIT, field: str) -> bytes:
    """Encode a JSON value that has no bytes form (saga data, step outputs) by the same
    rules as a JSON payload, or raise :class:`InvalidPayload` naming ``field``."""
    if isinstance(value, bytes | bytearray | memoryview):
        raise InvalidPayload(field, "must be a JSON value, not bytes")
    data = _encode_value(value, field, "the value", "")
    _check_size(data, field, limit)
    return data


def encode_plain(value: Any, limit: int) -> bytes | None:
    """The JSON encoding of ``value`` when it is plain JSON (see :func:`_plain`) of at most
    ``limit`` bytes, else ``None``: :func:`encode_payload` then says what is wrong, or
    takes it as bytes. The loop of a batch's payloads, without the checks of each call's
    options."""
    if not _plain(value, 0):
        return None
    try:
        data = _checked_json(value)
    except ValueError:  # UnicodeEncodeError among them
        return None
    return data if len(data) <= limit else None


def _encode_value(value: Any, field: str, where: str, hint: str) -> bytes:
    if not _plain(value, 0):
        _check_value(value, field, where, 0, hint)
    try:
        return _checked_json(value)
    except UnicodeEncodeError:
        _check_value(value, field, where, 0, hint)
        raise InvalidPayload(field, "is not valid Unicode") from None
    except ValueError as error:  # an integer beyond Python's printable digit limit
        raise InvalidPayload(field, f"cannot be encoded as JSON: {error}") from None


def _check_size(data: bytes, field: str, limit: int) -> None:
    if len(data) > limit:
        raise InvalidPayload(field, f"is {len(data)} bytes encoded; the limit is {limit} bytes")


def decode_payload(data: bytes, content_type: str) -> Any:
    """Decode stored payload bytes: JSON content is parsed, anything else is returned as bytes.

    A stored ``application/json`` payload that does not parse (written by raw SQL, or by a
    version that stored JSON-labelled bytes unchecked) is returned as its raw bytes, so that
    one bad row cannot break the claim or listing that reads it; ``content_type`` still
    says ``application/json``."""
    if content_type == JSON_CONTENT_TYPE:
        try:
            return _loads(data)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError too
            return bytes(data)
    return bytes(data)


_raw_decode = json.JSONDecoder().raw_decode
_JSON_SPACE = " \t\n\r"


def _loads(data: bytes) -> Any:
    """``json.loads(data)``, in fewer steps for a claim's usual payload: an object or array
    in UTF-8 (its first byte says so: not a byte-order mark, not UTF-16 or UTF-32)."""
    if type(data) is bytes and data[:1] in (b"{", b"[") and data[1:2] != b"\x00":
        text = data.decode("utf-8", "surrogatepass")
        value, end = _raw_decode(text)
        if end != len(text) and text[end:].lstrip(_JSON_SPACE):
            raise ValueError("extra data after the JSON value")
        return value
    return json.loads(data)


def encode_json(value: Any) -> str:
    """Compact JSON text for internal columns (headers, error details)."""
    return _encoder.encode(value)


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data, for the CLI's ``--json`` and the dashboard's API:
    dataclasses as objects, times as ISO 8601 in UTC, enums as their values, bytes as
    base64, tuples as lists, non-finite floats as ``None`` (JSON has no NaN)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def raw_preview(payload: bytes | bytearray, content_type: str) -> str:
    """A raw (non-JSON) payload as the CLI and the dashboard show it, by its size and
    content type: ``<12 bytes of text/plain>``."""
    return f"<{len(payload)} bytes of {content_type}>"
