"""Topic names, subscription patterns and both matchers (pure; no database)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlbroker import InvalidName, ValidationError
from sqlbroker.core.topics import (
    MAX_NAME_LENGTH,
    MAX_SEGMENT_LENGTH,
    is_wildcard,
    pattern_matches,
    pattern_regex,
    regex_matches,
    validate_pattern,
    validate_topic,
)

# --- validate_topic ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        "a",
        "orders",
        "orders.created",
        "Orders.Created-v2.eu_west.1",
        "_",
        "-",
        "a.b.c.d.e.f.g.h",
        "x" * MAX_SEGMENT_LENGTH,
        ".".join(["a" * 64, "b" * 64, "c" * 64, "d" * 60]),  # 255 characters
        "0123456789",
    ],
)
def test_valid_topics(topic: str) -> None:
    assert validate_topic(topic) == topic


@pytest.mark.parametrize(
    ("topic", "problem"),
    [
        ("", "empty"),
        (".".join(["a" * 64, "b" * 64, "c" * 64, "d" * 61]), "256 characters"),
        ("x" * (MAX_SEGMENT_LENGTH + 1), "longer than 64"),
        ("a..b", "empty segment"),
        (".a", "empty segment"),
        ("a.", "empty segment"),
        (".", "empty segment"),
        ("a b", "segment"),
        ("a*", "segment"),
        ("*", "segment"),
        ("#", "segment"),
        ("a.#", "segment"),
        ("x'; DROP TABLE sqlbroker_message; --", "segment"),
        ('a"b', "segment"),
        ("ü", "segment"),
        ("%", "segment"),
        ("a/b", "segment"),
        ("a\x00", "segment"),
        ("a\n", "segment"),
        ("١٢", "segment"),  # Unicode digits are not ASCII digits
    ],
)
def test_invalid_topics(topic: str, problem: str) -> None:
    with pytest.raises(InvalidName) as caught:
        validate_topic(topic)
    assert caught.value.field == "topic"
    assert problem in str(caught.value)


@pytest.mark.parametrize("value", [None, 1, b"topic", ["a"], 1.5])
def test_topic_must_be_a_string(value: object) -> None:
    with pytest.raises(InvalidName, match="must be a string"):
        validate_topic(value)


def test_field_name_is_passed_through() -> None:
    with pytest.raises(ValidationError) as caught:
        validate_topic("a..b", "queue")
    assert caught.value.field == "queue"
    assert str(caught.value).startswith("queue: ")


def test_max_lengths() -> None:
    assert MAX_NAME_LENGTH == 255
    assert MAX_SEGMENT_LENGTH == 64


# --- validate_pattern -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern", ["a", "*", "#", "a.*", "*.a", "a.#", "#.a", "a.*.#", "#.#", "*.*", "a.#.b.*"]
)
def test_valid_patterns(pattern: str) -> None:
    assert validate_pattern(pattern) == pattern


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "empty"),
        ("a.*b", "stand alone"),
        ("a.##", "stand alone"),
        ("a#", "stand alone"),
        ("**", "stand alone"),
        ("*a.b", "stand alone"),
        ("a..*", "empty segment"),
        ("#.", "empty segment"),
        (".#", "empty segment"),
        ("a b.*", "segment"),
        ("%.*", "segment"),
        ("*." + "a" * 254, "256 characters"),
    ],
)
def test_invalid_patterns(pattern: str, problem: str) -> None:
    with pytest.raises(InvalidName) as caught:
        validate_pattern(pattern)
    assert caught.value.field == "pattern"
    assert problem in str(caught.value)


def test_is_wildcard() -> None:
    assert is_wildcard("a.*")
    assert is_wildcard("#")
    assert not is_wildcard("a.b")
    assert not is_wildcard("a-b_c")


# --- matching ---------------------------------------------------------------------------------

AMQP_EXAMPLES = [
    # (pattern, topic, matches)
    ("a.#", "a", True),
    ("#.a", "a", True),
    ("*", "a.b", False),
    ("*", "a", True),
    ("#", "a", True),
    ("#", "a.b.c.d", True),
    ("a.b", "a.b", True),
    ("a.b", "a.b.c", False),
    ("a.b", "a", False),
    ("a.*", "a", False),
    ("a.*", "a.b", True),
    ("a.*", "a.b.c", False),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "b.c.a", True),
    ("#.a", "a.b", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("*.#", "a", True),
    ("*.*.#", "a", False),
    ("#.*", "a", True),
    ("#.#", "a.b", True),
    ("*.b.#", "a.b", True),
    ("*.b.#", "b", False),
    ("stock.usd.nyse", "stock.usd.nyse", True),
    ("stock.*.nyse", "stock.eur.nyse", True),
    ("quick.orange.rabbit", "quick.orange.fox", False),
    ("lazy.#", "lazy.orange.male.rabbit", True),
    ("*.orange.*", "quick.orange.male.rabbit", False),
    ("a-b", "a-b", True),
    ("a_b", "aXb", False),
    ("A", "a", False),
]


@pytest.mark.parametrize(("pattern", "topic", "expected"), AMQP_EXAMPLES)
def test_amqp_examples_with_both_matchers(pattern: str, topic: str, expected: bool) -> None:
    assert pattern_matches(pattern, topic) is expected
    assert regex_matches(pattern_regex(pattern), topic) is expected


def test_regex_matches_what_the_databases_evaluate() -> None:
    """The regex is anchored and matched against "." + topic, so a partial match never counts."""
    regex = pattern_regex("a.*")
    assert regex.startswith("^")
    assert regex.endswith("$")
    assert re.search(regex, ".a.b")
    assert not re.search(regex, ".xa.b")
    assert not re.search(regex, ".a.b.c")


def test_regex_uses_only_posix_compatible_syntax() -> None:
    """PostgreSQL evaluates these with ``~``: no lookarounds, no non-greedy, no named groups."""
    for pattern in ("a", "*", "#", "a.*.#.b", "#.x-y_z"):
        regex = pattern_regex(pattern)
        assert not re.search(r"\(\?|\*\?|\+\?|\\[dwsb]", regex), regex


# --- property: the regex agrees with the reference matcher ------------------------------------

words = st.sampled_from(["a", "b", "ab"])
topics = st.lists(words, min_size=1, max_size=6).map(".".join)
patterns = st.lists(st.one_of(words, st.just("*"), st.just("#")), min_size=1, max_size=6).map(
    ".".join
)


@settings(max_examples=1000, deadline=None)
@given(pattern=patterns, topic=topics)
def test_regex_agrees_with_reference_matcher(pattern: str, topic: str) -> None:
    validate_pattern(pattern)
    validate_topic(topic)
    assert regex_matches(pattern_regex(pattern), topic) == pattern_matches(pattern, topic)


@settings(max_examples=300, deadline=None)
@given(topic=topics)
def test_a_topic_matches_itself_and_the_wildcards(topic: str) -> None:
    assert pattern_matches(topic, topic)
    assert pattern_matches("#", topic)
    assert pattern_matches(".".join("*" for _ in topic.split(".")), topic)
    assert pattern_matches(topic.split(".")[0] + ".#", topic)
    assert regex_matches(pattern_regex(topic), topic)


@settings(max_examples=300, deadline=None)
@given(pattern=patterns, topic=topics)
def test_hash_hash_is_hash(pattern: str, topic: str) -> None:
    """Adjacent '#' segments mean the same as one."""
    collapsed = re.sub(r"#(\.#)+", "#", pattern)
    assert pattern_matches(pattern, topic) == pattern_matches(collapsed, topic)


# With a backtracking engine each '#' multiplies the ways to split a long topic: against
# 128 segments these would take hours (SQLite evaluates with Python's re).
PATHOLOGICAL = ["#.#.#.#.#.#.#.#.#.#.z", "#.a.#.a.#.a.#.a.#.a.#.a.#.a.#.z"]
LONG_TOPIC = ".".join(["a"] * 128)
assert len(LONG_TOPIC) == MAX_NAME_LENGTH


def test_runs_of_hash_collapse_in_the_regex() -> None:
    assert pattern_regex("a.#.#.#.b") == pattern_regex("a.#.b")
    assert pattern_regex("#.#") == pattern_regex("#")
    assert pattern_regex("#.*.#") != pattern_regex("#.#")


@pytest.mark.parametrize("pattern", PATHOLOGICAL)
def test_many_hashes_match_without_backtracking(pattern: str) -> None:
    uncollapsed = (
        "^"
        + "".join(r"(\.[^.]+)*" if part == "#" else r"\." + part for part in pattern.split("."))
        + "$"
    )  # the shape stored by earlier versions
    for regex in (pattern_regex(pattern), uncollapsed):
        assert not regex_matches(regex, LONG_TOPIC)
        assert regex_matches(regex, LONG_TOPIC[:-1] + "z")
    assert not pattern_matches(pattern, LONG_TOPIC)


def test_the_property_test_sees_both_answers() -> None:
    """Guard the generator: from its alphabet, matches and non-matches both occur often."""
    results = [
        pattern_matches(p, t)
        for p in ("a.*", "#.b", "*", "a.#.b")
        for t in ("a", "a.b", "b.a.b", "ab")
    ]
    assert any(results)
    assert not all(results)


@settings(max_examples=500, deadline=None)
@given(
    segments=st.lists(
        st.text(alphabet="abcXYZ019_-", min_size=1, max_size=MAX_SEGMENT_LENGTH),
        min_size=1,
        max_size=3,
    )
)
def test_generated_valid_topics(segments: list[str]) -> None:
    topic = ".".join(segments)
    assert validate_topic(topic) == topic
    assert validate_pattern(topic) == topic
    assert pattern_matches(topic, topic)
