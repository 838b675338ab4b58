"""atheris harness for the payload codec (``sqlbroker.core.serde``).

From the fuzzer's bytes it builds a Python value (nested lists, tuples and dicts of every
JSON scalar, plus what JSON lacks: NaN, infinities, NUL characters, lone surrogates,
integers beyond the digit limit, non-string keys, sets, bytes) and encodes it. Each input
must be refused with ``InvalidPayload``/``InvalidOption``, or encoded within the size limit
to UTF-8 JSON (or the bytes themselves) that decodes back to the same value.

Run: ``python tests/fuzz/harness_serde.py -runs=100000`` (any libFuzzer flag works).
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any

import atheris

with atheris.instrument_imports(include=["sqlbroker.core"]):
    from sqlbroker.core.errors import InvalidOption, InvalidPayload
    from sqlbroker.core.serde import (
        BYTES_CONTENT_TYPE,
        HARD_PAYLOAD_LIMIT,
        JSON_CONTENT_TYPE,
        decode_payload,
        encode_payload,
    )

ODD_STRINGS = ["", "\x00", "\ud800", "a\udfffb", "é", "😀", "\u2028", '"', "\\", "\x7f"]
CONTENT_TYPES = [None, JSON_CONTENT_TYPE, BYTES_CONTENT_TYPE, "text/plain", "", "a\nb", "é", 5]


def build(fdp: atheris.FuzzedDataProvider, depth: int) -> Any:
    kind = fdp.ConsumeIntInRange(0, 13 if depth < 70 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 16))
    if kind == 3:
        return 10 ** fdp.ConsumeIntInRange(0, 5000) * (1 if fdp.ConsumeBool() else -1)
    if kind == 4:
        return fdp.ConsumeRegularFloat()
    if kind == 5:
        return fdp.PickValueInList([math.nan, math.inf, -math.inf, -0.0, 5e-324])
    if kind == 6:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 12))
    if kind == 7:
        return fdp.PickValueInList(ODD_STRINGS)
    if kind == 8:
        return [build(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if kind == 9:
        return tuple(build(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 2)))
    if kind == 10:
        result: dict[Any, Any] = {}
        for _ in range(fdp.ConsumeIntInRange(0, 3)):
            key = fdp.ConsumeUnicode(4) if fdp.ConsumeIntInRange(0, 5) else build(fdp, 99)
            # An unhashable key is not a payload anyone can pass.
            with contextlib.suppress(TypeError):
                result[key] = build(fdp, depth + 1)
        return result
    if kind == 11:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16))
    if kind == 12:
        return {1, 2}
    return build(fdp, depth + 1) if depth < 80 else [build(fdp, depth + 1)]


def plain(value: Any) -> Any:
    """What a consumer must decode for ``value``: tuples become lists."""
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def same(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float):
        return left == right and math.copysign(1, left) == math.copysign(1, right)
    if type(left) is not type(right):
        return False
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same, left, right))
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    return bool(left == right)


def test_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    content_type = fdp.PickValueInList(CONTENT_TYPES)
    limit = fdp.PickValueInList([1, 16, 1024, 256 * 1024, HARD_PAYLOAD_LIMIT])
    payload = build(fdp, 0)
    if isinstance(payload, bytes) and fdp.ConsumeBool():
        payload = bytearray(payload)
    try:
        encoded, kind = encode_payload(payload, content_type=content_type, limit=limit)
    except (InvalidPayload, InvalidOption) as error:
        refused: InvalidPayload | InvalidOption = error
    else:
        check_encoded(payload, content_type, limit, encoded, kind)
        return
    if refused.field not in ("payload", "content_type"):
        raise AssertionError(f"refused with field {refused.field!r}: {refused}")


def check_encoded(payload: Any, content_type: Any, limit: int, encoded: bytes, kind: str) -> None:
    assert isinstance(encoded, bytes)
    assert len(encoded) <= limit
    if isinstance(payload, bytes | bytearray):
        assert encoded == bytes(payload)
        assert kind == (content_type or BYTES_CONTENT_TYPE)
        return
    assert kind == JSON_CONTENT_TYPE
    encoded.decode("utf-8")  # strict: no surrogates reach the database
    assert b"\x00" not in encoded
    decoded = decode_payload(encoded, kind)
    assert same(decoded, plain(payload)), (payload, decoded)


def main(argv: list[str]) -> None:
    sys.setrecursionlimit(10_000)
    atheris.Setup(argv, test_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
