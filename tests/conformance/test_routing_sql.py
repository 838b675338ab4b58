"""Routing through the real SQL path (PostgreSQL's regex engine, SQLite's registered
function) agrees with the reference matcher, for generated patterns and topics."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sqlbroker
from sqlbroker.core.topics import pattern_matches

# A small alphabet, so that generated patterns and topics actually match each other.
WORDS = st.sampled_from(["a", "b", "c-1", "d_2"])
TOPICS = st.lists(WORDS, min_size=1, max_size=4).map(".".join)
PATTERNS = st.lists(st.one_of(WORDS, st.just("*"), st.just("#")), min_size=1, max_size=4).map(
    ".".join
)
_names = itertools.count()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(patterns=st.lists(PATTERNS, min_size=1, max_size=4, unique=True), topic=TOPICS)
def test_fan_out_matches_the_reference(
    broker: sqlbroker.Broker, patterns: list[str], topic: str
) -> None:
    run = next(_names)
    names = {pattern: f"r{run}-{index}" for index, pattern in enumerate(patterns)}
    for pattern, name in names.items():
        broker.subscribe(name, [pattern])
    try:
        message_id = broker.publish(topic, {"run": run})
        routed = {p.subscription for p in broker.pending() if p.message_id == message_id}
        expected = {name for pattern, name in names.items() if pattern_matches(pattern, topic)}
        assert routed == expected, (patterns, topic)
        unrouted = broker.archive(outcome="unrouted", message_id=message_id)
        assert bool(unrouted) == (not expected)
    finally:
        # Examples share one database: leave no subscription behind for the next one.
        for name in names.values():
            broker.unsubscribe(name)


def test_routing_does_not_backtrack_on_many_hashes(broker: sqlbroker.Broker) -> None:
    """On SQLite routing runs inside the write transaction: a backtracking matcher would
    hold the write lock for hours on these (see tests/test_topics.py)."""
    broker.subscribe("hashes", ["#.#.#.#.#.#.#.#.#.#.z", "#.a.#.a.#.a.#.a.#.a.#.a.#.a.#.z"])
    topic = ".".join(["a"] * 128)
    missed = broker.publish(topic, 1)
    routed = broker.publish(topic[:-1] + "z", 2)
    assert [p.message_id for p in broker.pending("hashes")] == [routed]
    assert [a.message_id for a in broker.archive(outcome="unrouted")] == [missed]


def test_routing_agrees_with_the_reference_on_every_small_case(broker: sqlbroker.Broker) -> None:
    """Every pattern of up to three segments over a, b, '*' and '#' against every topic of up
    to three words over a and b: the cheap first/last-segment tests the routing statements
    run before the full match must never drop a match."""
    parts = ["a", "b", "*", "#"]
    patterns = [
        ".".join(combo) for size in (1, 2, 3) for combo in itertools.product(parts, repeat=size)
    ]
    names = {pattern: f"small-{index}" for index, pattern in enumerate(patterns)}
    for pattern, name in names.items():
        broker.subscribe(name, [pattern])
    topics = [".".join(c) for size in (1, 2, 3) for c in itertools.product("ab", repeat=size)]
    for topic in topics:
        message_id = broker.publish(topic, {})
        routed = {p.subscription for p in broker.pending(limit=1000) if p.message_id == message_id}
        expected = {name for pattern, name in names.items() if pattern_matches(pattern, topic)}
        assert routed == expected, topic
