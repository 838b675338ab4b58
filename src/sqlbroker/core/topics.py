"""Topic names, subscription patterns and their matching rules.

A topic is a dotted name such as ``orders.created``: segments of ``[A-Za-z0-9_-]{1,64}``
joined by dots, at most 255 characters. A pattern is a topic whose segments may also be
``*`` (exactly one segment) or ``#`` (zero or more segments), as in AMQP topic exchanges.

Two matchers exist on purpose: :func:`pattern_matches` is the reference (segment by
segment, easy to reason about) and :func:`pattern_regex` is what the databases evaluate.
Property tests hold the second against the first.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

from sqlbroker.core.errors import InvalidName

MAX_NAME_LENGTH = 255
MAX_SEGMENT_LENGTH = 64
_SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)


def _check_text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidName(field, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidName(field, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidName(field, f"is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}")
    return value


def _bad_segment(field: str, value: str, segment: str) -> InvalidName:
    if not segment:
        return InvalidName(
            field, f"{value!r} has an empty segment (leading, trailing or double dot)"
        )
    if len(segment) > MAX_SEGMENT_LENGTH:
        return InvalidName(
            field, f"{value!r} has a segment longer than {MAX_SEGMENT_LENGTH} characters"
        )
    return InvalidName(
        field,
        f"{value!r} has the segment {segment!r}; segments use only letters, digits, '_' and '-'",
    )


def validate_topic(value: object, field: str = "topic") -> str:
    """Return ``value`` if it is a valid topic (or queue/subscription name), else raise."""
    text = _check_text(value, field)
    for segment in text.split("."):
        if not _SEGMENT.fullmatch(segment):
            raise _bad_segment(field, text, segment)
    return text


def validate_pattern(value: object, field: str = "pattern") -> str:
    """Return ``value`` if it is a valid subscription pattern, else raise."""
    text = _check_text(value, field)
    for segment in text.split("."):
        if segment in ("*", "#"):
            continue
        if not _SEGMENT.fullmatch(segment):
            if "*" in segment or "#" in segment:
                raise InvalidName(
                    field, f"{text!r}: '*' and '#' must stand alone as a whole segment"
                )
            raise _bad_segment(field, text, segment)
    return text


def is_wildcard(pattern: str) -> bool:
    """Whether a (valid) pattern contains ``*`` or ``#``."""
    return any(segment in ("*", "#") for segment in pattern.split("."))


def pattern_matches(pattern: str, topic: str) -> bool:
    """Reference matcher: does ``topic`` match ``pattern``? Both must already be valid."""
    parts = pattern.split(".")
    words = topic.split(".")

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(parts):
            return j == len(words)
        part = parts[i]
        if part == "#":
            return any(match(i + 1, k) for k in range(j, len(words) + 1))
        if j == len(words):
            return False
        return (part == "*" or part == words[j]) and match(i + 1, j + 1)

    return match(0, 0)


def pattern_regex(pattern: str) -> str:
    """The POSIX/Python regular expression that a database evaluates for ``pattern``.

    It is matched against ``"." + topic``, so that every segment, including the first,
    is preceded by a dot and ``#`` can stand for zero segments without special cases.
    Segment text is limited to ``[A-Za-z0-9_-]``, which needs no escaping.
    """
    pieces = []
    for part in pattern.split("."):
        if part == "*":
            pieces.append(r"\.[^.]+")
        elif part == "#":
            pieces.append(r"(\.[^.]+)*")
        else:
            pieces.append(r"\." + part)
    return "^" + "".join(pieces) + "$"


@lru_cache(maxsize=4096)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


def regex_matches(regex: str, topic: str) -> bool:
    """Evaluate a regex made by :func:`pattern_regex` the way the SQL path does."""
    return _compiled(regex).search("." + topic) is not None
