"""Payload encoding (pure; no database): strict JSON or raw bytes, never pickle."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from decimal import Decimal
from enum import Enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlbroker import InvalidOption, InvalidPayload, Priority
from sqlbroker.core.serde import (
    BYTES_CONTENT_TYPE,
    DEFAULT_PAYLOAD_LIMIT,
    HARD_PAYLOAD_LIMIT,
    JSON_CONTENT_TYPE,
    MAX_DEPTH,
    check_payload_limit,
    decode_payload,
    encode_json,
    encode_payload,
    encode_value,
)


def round_trip(payload: Any, **options: Any) -> Any:
    data, content_type = encode_payload(payload, **options)
    assert isinstance(data, bytes)
    return decode_payload(data, content_type)


def test_limits() -> None:
    assert DEFAULT_PAYLOAD_LIMIT == 256 * 1024
    assert HARD_PAYLOAD_LIMIT == 1024 * 1024


@pytest.mark.parametrize(
    "payload",
    [
        None,
        True,
        False,
        0,
        -7,
        2**100,
        0.5,
        -0.0,
        1e-320,
        "",
        "ünïcødé ✓ 🎉",
        "\u2028\u2029",
        [],
        {},
        [1, "two", 3.0, None, True, {"k": [{}]}],
        {"z": 1, "a": 2},
        {"": "empty key"},
    ],
    ids=repr,
)
def test_json_round_trip(payload: Any) -> None:
    data, content_type = encode_payload(payload)
    assert content_type == JSON_CONTENT_TYPE
    decoded = decode_payload(data, content_type)
    assert decoded == payload
    assert type(decoded) is type(payload)
    if isinstance(payload, dict):
        assert list(decoded) == list(payload)
    if isinstance(payload, float):
        assert math.copysign(1.0, decoded) == math.copysign(1.0, payload)


def test_encoding_is_compact_utf8() -> None:
    data, _ = encode_payload({"a": [1, 2], "é": "✓"})
    assert data == '{"a":[1,2],"é":"✓"}'.encode()


def test_tuples_become_lists() -> None:
    assert round_trip((1, (2, 3))) == [1, [2, 3]]


def test_subclasses_of_json_types_encode_as_their_base() -> None:
    assert round_trip(Priority.HIGH) == 1
    assert round_trip(OrderedDict([("b", 1), ("a", 2)])) == {"b": 1, "a": 2}


@pytest.mark.parametrize(
    ("payload", "content_type", "expected_type"),
    [
        (b"\x00\xff", None, BYTES_CONTENT_TYPE),
        (bytearray(b"ab"), "text/plain", "text/plain"),
        (memoryview(b"mv"), "application/x-thing", "application/x-thing"),
        (b"", None, BYTES_CONTENT_TYPE),
        (b'{"not": "parsed"}', None, BYTES_CONTENT_TYPE),
    ],
)
def test_bytes_pass_through(payload: Any, content_type: str | None, expected_type: str) -> None:
    data, kind = encode_payload(payload, content_type=content_type)
    assert data == bytes(payload)
    assert kind == expected_type
    decoded = decode_payload(data, kind)
    assert decoded == bytes(payload)
    assert isinstance(decoded, bytes)


def test_bytes_may_carry_the_json_content_type() -> None:
    data, kind = encode_payload(b'{"a":1}', content_type=JSON_CONTENT_TYPE)
    assert kind == JSON_CONTENT_TYPE
    assert decode_payload(data, kind) == {"a": 1}


def test_json_value_with_explicit_json_content_type() -> None:
    assert encode_payload([1], content_type=JSON_CONTENT_TYPE) == (b"[1]", JSON_CONTENT_TYPE)


def test_decode_accepts_memoryview_like_buffers() -> None:
    assert decode_payload(bytes(memoryview(b"[1]")), JSON_CONTENT_TYPE) == [1]


class Colour(Enum):
    RED = "red"


class Custom:
    def __reduce__(self) -> Any:  # never reached: payloads are never pickled
        raise AssertionError("pickled")


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        (object(), "the payload is a object"),
        ({1, 2}, "the payload is a set"),
        (frozenset(), "frozenset"),
        (Decimal("1.5"), "Decimal"),
        (Colour.RED, "Colour"),
        (Custom(), "Custom"),
        (complex(1, 2), "complex"),
        (math.nan, "NaN"),
        (math.inf, "infinity"),
        (-math.inf, "infinity"),
        ({"a": [1, math.nan]}, "the payload['a'][1]"),
        ("a\x00b", "NUL"),
        ({"k\x00": 1}, "a key in the payload"),
        ("\ud800", "lone surrogate"),
        ({"\udfff": 1}, "lone surrogate"),
        ({1: "a"}, "key of type int"),
        ({None: "a"}, "key of type NoneType"),
        ([[[[1j]]]], "the payload[0][0][0][0]"),
        (type, "type"),
        (print, "builtin_function_or_method"),
    ],
    ids=lambda value: None if isinstance(value, str) else type(value).__name__,
)
def test_rejected_payloads(payload: Any, where: str) -> None:
    with pytest.raises(InvalidPayload) as caught:
        encode_payload(payload)
    assert caught.value.field == "payload"
    assert where in str(caught.value)


@pytest.mark.parametrize("raw", [b"{}", bytearray(b"[]"), memoryview(b"1")])
def test_a_json_value_without_a_bytes_form_refuses_bytes(raw: Any) -> None:
    with pytest.raises(InvalidPayload, match="must be a JSON value, not bytes") as caught:
        encode_value(raw, field="data")
    assert caught.value.field == "data"


def test_a_json_value_is_checked_like_a_payload_but_named_as_a_value() -> None:
    with pytest.raises(InvalidPayload) as caught:
        encode_value({"when": Decimal("1.5")}, field="output")
    assert caught.value.field == "output"
    assert "the value['when'] is a Decimal, which is not JSON" in str(caught.value)
    assert "bytes" not in str(caught.value)  # bytes are refused here: no such advice
    with pytest.raises(InvalidPayload, match="the limit is 8 bytes"):
        encode_value("a long string", limit=8, field="data")
    assert encode_value({"b": [1, "é"]}, field="data") == '{"b":[1,"é"]}'.encode()


def test_field_prefix_is_used() -> None:
    with pytest.raises(InvalidPayload) as caught:
        encode_payload(math.nan, field="messages[2].payload")
    assert caught.value.field == "messages[2].payload"


def _nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def test_depth_limit() -> None:
    assert round_trip(_nested(MAX_DEPTH)) == _nested(MAX_DEPTH)
    with pytest.raises(InvalidPayload, match="deeper"):
        encode_payload(_nested(MAX_DEPTH + 1))


def test_a_recursive_structure_is_refused_not_a_crash() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidPayload):
        encode_payload(loop)


def test_an_integer_too_large_to_print_is_refused() -> None:
    """Python refuses to turn ints of more than 4300 digits into text: that must surface as
    InvalidPayload, not as a bare ValueError from the JSON encoder."""
    with pytest.raises(InvalidPayload) as caught:
        encode_payload({"n": 10**5000})
    assert caught.value.field == "payload"


def test_size_limit_counts_encoded_bytes() -> None:
    assert len(encode_payload("x" * 98, limit=100)[0]) == 100
    with pytest.raises(InvalidPayload, match="101 bytes"):
        encode_payload("x" * 99, limit=100)
    assert len(encode_payload("é" * 49, limit=100)[0]) == 100  # two bytes each + quotes
    with pytest.raises(InvalidPayload):
        encode_payload("é" * 49 + "x", limit=100)
    assert encode_payload(b"y" * 100, limit=100)[0] == b"y" * 100
    with pytest.raises(InvalidPayload):
        encode_payload(b"y" * 101, limit=100)


def test_default_limit_applies() -> None:
    encode_payload(b"x" * DEFAULT_PAYLOAD_LIMIT)
    with pytest.raises(InvalidPayload):
        encode_payload(b"x" * (DEFAULT_PAYLOAD_LIMIT + 1))


@pytest.mark.parametrize(
    "content_type", ["", "x" * 256, "text/plain\n", "tëxt/plain", 5, b"text/plain"], ids=repr
)
def test_bad_content_types(content_type: Any) -> None:
    with pytest.raises(InvalidPayload) as caught:
        encode_payload(b"data", content_type=content_type)
    assert caught.value.field == "content_type"


def test_json_payload_with_another_content_type_is_refused() -> None:
    with pytest.raises(InvalidPayload) as caught:
        encode_payload({"a": 1}, content_type="text/plain")
    assert caught.value.field == "content_type"


@pytest.mark.parametrize("limit", [1, 1000, HARD_PAYLOAD_LIMIT])
def test_valid_payload_limits(limit: int) -> None:
    assert check_payload_limit(limit) == limit


@pytest.mark.parametrize("limit", [0, -1, HARD_PAYLOAD_LIMIT + 1, True, 1.5, "100", None])
def test_invalid_payload_limits(limit: Any) -> None:
    with pytest.raises(InvalidOption) as caught:
        check_payload_limit(limit)
    assert caught.value.field == "payload_limit"


def test_non_json_content_decodes_to_bytes() -> None:
    assert decode_payload(b"[1]", "text/plain") == b"[1]"


def test_encode_json_is_compact_and_strict() -> None:
    assert encode_json({"a": "é", "b": [1]}) == '{"a":"é","b":[1]}'
    with pytest.raises(ValueError, match="JSON compliant"):
        encode_json(math.nan)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(
                alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                max_size=8,
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(payload=json_values)
def test_property_json_round_trip(payload: Any) -> None:
    data, content_type = encode_payload(payload, limit=HARD_PAYLOAD_LIMIT)
    assert content_type == JSON_CONTENT_TYPE
    assert decode_payload(data, content_type) == payload
    assert json.loads(data) == payload


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=2048))
def test_property_bytes_round_trip(payload: bytes) -> None:
    assert round_trip(payload) == payload


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":[1,2],"\xc3\xa9":"\xe2\x9c\x93"}',
        b"[1, 2.5, null, NaN, -Infinity]",
        b'{"a":1} \t\r\n',
        b'{"a":1} x',
        b'{"a":1}{"b":2}',
        b"[1,]",
        b"{",
        b"[",
        b'{"a": "\xff"}',
        b'{"a": "\xed\xa0\x80"}',
        '{"a":1}'.encode("utf-16-le"),
        '["x"]'.encode("utf-32-le"),
        '["x"]'.encode("utf-8-sig"),
        b"[" * 100_000,
        b' {"a":1}',
        b"7",
        b"",
    ],
    ids=repr,
)
def test_a_json_payload_decodes_as_json_loads_decodes_it(data: bytes) -> None:
    """An object or array in UTF-8 takes a shorter way than ``json.loads``: what comes out
    (a value, or the raw bytes of what does not parse) is the same."""
    try:
        expected = json.loads(data)
    except (ValueError, RecursionError):
        expected = data
    decoded = decode_payload(data, JSON_CONTENT_TYPE)
    assert type(decoded) is type(expected)
    assert repr(decoded) == repr(expected)
