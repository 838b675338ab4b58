"""atheris harness for topic and pattern parsing (``sqlbroker.core.topics``).

Each input is split into a would-be pattern and a would-be topic. Validation must accept a
string or raise ``InvalidName``; whatever it accepts keeps to the naming rules; and for a
valid pattern and topic, the regular expression the databases evaluate must agree with the
reference matcher (and with PostgreSQL's view of it: the regex is plain POSIX).

Run: ``python tests/fuzz/harness_topics.py -runs=100000`` (any libFuzzer flag works).
"""

from __future__ import annotations

import re
import sys

import atheris

with atheris.instrument_imports(include=["sqlbroker.core"]):
    from sqlbroker.core.errors import InvalidName
    from sqlbroker.core.topics import (
        is_wildcard,
        pattern_matches,
        pattern_regex,
        regex_matches,
        validate_pattern,
        validate_topic,
    )

SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
ALPHABET = "ab.*#-_Z09 é\x00\n"


def text(fdp: atheris.FuzzedDataProvider) -> str:
    if fdp.ConsumeBool():
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 300))
    count = fdp.ConsumeIntInRange(0, 40)
    return "".join(ALPHABET[fdp.ConsumeIntInRange(0, len(ALPHABET) - 1)] for _ in range(count))


def checked(function: object, value: str) -> str | None:
    try:
        result = function(value, "name")  # type: ignore[operator]
    except InvalidName as error:
        if error.field != "name":
            raise AssertionError(f"refused with field {error.field!r}") from error
        return None
    assert result == value
    return value


def test_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    pattern, topic = text(fdp), text(fdp)
    valid_topic = checked(validate_topic, topic)
    valid_pattern = checked(validate_pattern, pattern)
    if valid_topic is not None:
        assert len(valid_topic) <= 255
        assert all(SEGMENT.fullmatch(segment) for segment in valid_topic.split("."))
        assert checked(validate_pattern, valid_topic) == valid_topic, "a topic is a pattern"
        assert not is_wildcard(valid_topic)
        assert pattern_matches(valid_topic, valid_topic)
    if valid_pattern is not None:
        assert len(valid_pattern) <= 255
        regex = pattern_regex(valid_pattern)
        assert regex.isascii()
        assert "\x00" not in regex
        if valid_topic is not None:
            assert regex_matches(regex, valid_topic) == pattern_matches(
                valid_pattern, valid_topic
            ), (valid_pattern, valid_topic)


def main(argv: list[str]) -> None:
    atheris.Setup(argv, test_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
