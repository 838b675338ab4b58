"""Topic names, subscription patterns and their matching rules.

A topic is a dotted name such as ``orders.created``: segments of ``[A-Za-z0-9_-]{1,64}``
joined by dots, at most 255 characters. A pattern is a topic whose segments may also be
``*`` (exactly one segment) or ``#`` (zero or more segments), as in AMQP topic exchanges.

Two matchers exist on purpose: :func:`pattern_matches` is the reference (segment by
segment, easy to reason about) and :func:`pattern_regex` is what PostgreSQL evaluates,
built in the routing statement from the stored pattern (never read from the stored
``regex`` column, which raw SQL could have set to anything). Property tests hold routing
against the reference. PostgreSQL's regex engine is an automaton; SQLite routes through
:func:`stored_pattern_matches` and evaluates other regexes (the Spark source's topic
filter) with :func:`regex_matches`, which reads the regex back into segments rather than
handing it to Python's backtracking ``re`` (where every ``#`` multiplies the ways to split
a long topic: a handful of them against a 128-segment topic would hold the write lock for
hours).
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

from sqlbroker.core.errors import InvalidName, InvalidOption
from sqlbroker.core.validate import items, name_text

MAX_NAME_LENGTH = 255
MAX_SEGMENT_LENGTH = 64
SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
"""The one rule for a segment of a name: of a topic, a queue or subscription name, a
pattern's literal segment, and a tenant's name (:mod:`sqlbroker.features.security`)."""


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


@lru_cache(maxsize=4096)
def _is_topic(text: str) -> bool:
    """Whether ``text`` is a valid topic, remembered per name: every publish and claim
    checks one, mostly the same few (:func:`validate_topic` says what is wrong)."""
    return 0 < len(text) <= MAX_NAME_LENGTH and all(
        SEGMENT.fullmatch(segment) for segment in text.split(".")
    )


def validate_topic(value: object, field: str = "topic") -> str:
    """Return ``value`` if it is a valid topic (or queue/subscription name), else raise."""
    if type(value) is str and _is_topic(value):
        return value
    text = name_text(value, field, MAX_NAME_LENGTH)
    for segment in text.split("."):
        if not SEGMENT.fullmatch(segment):
            raise _bad_segment(field, text, segment)
    return text


def validate_pattern(value: object, field: str = "pattern") -> str:
    """Return ``value`` if it is a valid subscription pattern, else raise."""
    text = name_text(value, field, MAX_NAME_LENGTH)
    for segment in text.split("."):
        if segment in ("*", "#"):
            continue
        if not SEGMENT.fullmatch(segment):
            if "*" in segment or "#" in segment:
                raise InvalidName(
                    field, f"{text!r}: '*' and '#' must stand alone as a whole segment"
                )
            raise _bad_segment(field, text, segment)
    return text


def validate_patterns(value: object, field: str) -> tuple[str, ...]:
    """One pattern, or a non-empty list of them, each checked by :func:`validate_pattern`."""
    listed = [value] if isinstance(value, str) else items(value, field, "patterns")
    if not listed:
        raise InvalidOption(field, "give at least one pattern")
    return tuple(validate_pattern(pattern, field) for pattern in listed)


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


@lru_cache(maxsize=1024)
def pattern_regex(pattern: str) -> str:
    """The POSIX/Python regular expression that a database evaluates for ``pattern``.

    It is matched against ``"." + topic``, so that every segment, including the first,
    is preceded by a dot and ``#`` can stand for zero segments without special cases.
    Segment text is limited to ``[A-Za-z0-9_-]``, which needs no escaping. A run of ``#``
    segments means the same as one and becomes one group.
    """
    pieces = []
    for part in pattern.split("."):
        if part == "*":
            pieces.append(_ONE)
        elif part == "#":
            if not pieces or pieces[-1] != _ANY:
                pieces.append(_ANY)
        else:
            pieces.append(r"\." + part)
    return "^" + "".join(pieces) + "$"


_ONE = r"\.[^.]+"
_ANY = r"(\.[^.]+)*"
_LITERAL = re.compile(r"\\\.(" + SEGMENT.pattern + ")")


@lru_cache(maxsize=4096)
def _segments(regex: str) -> tuple[str, ...] | None:
    """The pattern segments of a regex made by :func:`pattern_regex` (by this version or an
    earlier one, which did not merge runs of ``#``); ``None`` for any other regex."""
    if not (regex.startswith("^") and regex.endswith("$")):
        return None
    body, position = regex[1:-1], 0
    parts: list[str] = []
    while position < len(body):
        if body.startswith(_ANY, position):
            parts.append("#")
            position += len(_ANY)
        elif body.startswith(_ONE, position):
            parts.append("*")
            position += len(_ONE)
        elif literal := _LITERAL.match(body, position):
            parts.append(literal.group(1))
            position = literal.end()
        else:
            return None
    return tuple(parts) if parts else None


def _segments_match(parts: tuple[str, ...], words: list[str]) -> bool:
    """Match segment by segment, tracking every pattern position at once (an automaton,
    never backtracking): at most ``len(parts) * len(words)`` steps."""
    end = len(parts)

    def closure(positions: set[int]) -> set[int]:
        # A '#' may stand for zero segments: whoever is at it is also just past it.
        for index in sorted(positions):
            while index < end and parts[index] == "#":
                index += 1
                positions.add(index)
        return positions

    positions = closure({0})
    for word in words:
        following = set()
        for index in positions:
            if index == end:
                continue
            part = parts[index]
            if part == "#":
                following.add(index)
            elif part == "*" or part == word:
                following.add(index + 1)
        if not following:
            return False
        positions = closure(following)
    return end in positions


@lru_cache(maxsize=65536)
def _stored_parts(pattern: str) -> tuple[str, ...] | None:
    try:
        validate_pattern(pattern)
    except InvalidName:
        return None
    return tuple(pattern.split("."))


def stored_pattern_matches(pattern: object, topic: str) -> bool:
    """Does a pattern read from the database match ``topic``? Routing's one rule on
    SQLite (``sqlbroker_pattern_match``): the pattern is validated again (a row damaged by
    raw SQL matches nothing) and matched segment by segment, never through a stored
    regex."""
    parts = _stored_parts(pattern) if isinstance(pattern, str) else None
    if parts is None:
        return False
    if "*" not in parts and "#" not in parts:
        return pattern == topic
    return _segments_match(parts, topic.split("."))


def regex_matches(regex: str, topic: str) -> bool:
    """Evaluate a regex made by :func:`pattern_regex` the way the SQL path does (SQLite's
    ``sqlbroker_regex_match``), without backtracking; see the module docstring."""
    parts = _segments(regex)
    if parts is None:
        return re.search(regex, "." + topic) is not None  # re keeps the compiled regex
    return _segments_match(parts, topic.split("."))
