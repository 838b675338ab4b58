"""Support for fuzzing the public API on both backends at once.

A fuzz test builds one call from random arguments and runs it on a SQLite and a PostgreSQL
broker in turn (:func:`same_on_both`). Each run must either succeed or raise a
``ValidationError`` subclass (or one of the documented errors the test allows); a refused
call must leave the database exactly as it was; and both backends must answer alike: both
succeed, or both raise the same exception type naming the same ``field``.

Arguments mix valid values with junk of every type, so that the fuzzer reaches deep into
the checks instead of stopping at the first ``isinstance``. A live delivery is passed as
the marker :data:`LIVE`, replaced by each backend's own delivery when the call runs.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

import sqlbroker
from helpers import table_counts

Call = Callable[["Target"], Any]


class _Live:
    def __repr__(self) -> str:
        return "LIVE"


LIVE: Any = _Live()
"""Stands for the target's live delivery in generated arguments."""


@dataclass
class Target:
    """One backend's broker, async broker and live delivery."""

    name: str
    url: str
    broker: sqlbroker.Broker
    async_broker: sqlbroker.AsyncBroker
    delivery: sqlbroker.Delivery

    def resolve(self, value: Any) -> Any:
        """``value`` with every :data:`LIVE` replaced by this target's delivery."""
        if value is LIVE:
            return self.delivery
        if isinstance(value, list):
            return [self.resolve(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self.resolve(item) for item in value)
        return value

    def snapshot(self) -> tuple[Any, ...]:
        return (table_counts(self.broker.backend), self.broker.pending(limit=1000))


@dataclass(frozen=True)
class Answer:
    """How one backend answered a call: ``"ok"`` or the exception's type and field."""

    outcome: str
    field: str | None = None


def answer(target: Target, call: Call, allowed: tuple[type[BaseException], ...]) -> Answer:
    before = target.snapshot()
    refused: sqlbroker.ValidationError | None = None
    try:
        call(target)
    except sqlbroker.ValidationError as error:
        refused = error
    except allowed as error:
        return Answer(type(error).__name__)
    if refused is None:
        return Answer("ok")
    message = str(refused)
    assert message.startswith(f"{refused.field}: "), message
    after = target.snapshot()
    assert after == before, f"{target.name}: a refused call wrote something ({message})"
    return Answer(type(refused).__name__, refused.field)


def same_on_both(
    targets: list[Target], call: Call, allowed: tuple[type[BaseException], ...] = ()
) -> Answer:
    """Run ``call`` on every target; all must answer alike. Returns the answer."""
    answers = {target.name: answer(target, call, allowed) for target in targets}
    assert len(set(answers.values())) == 1, f"the backends disagree: {answers}"
    return next(iter(answers.values()))


# --- strategies --------------------------------------------------------------------------------

ZONES = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-12))]

aware_times = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.sampled_from(ZONES)
)
naive_times = st.datetimes()
huge_ints = st.integers(min_value=-(2**1100), max_value=2**1100)
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e-300, 1e300, 5e-324])
odd_text = st.text(
    alphabet=st.sampled_from(
        [
            "a",
            "Z",
            "0",
            ".",
            "*",
            "#",
            "-",
            "_",
            " ",
            "é",
            "\x00",
            "\n",
            "\ud800",
            "'",
            '"',
            "%",
            "\u200b",
            "😀",
        ]
    ),
    max_size=12,
)


class Opaque:
    """Something no API should accept."""

    def __repr__(self) -> str:
        return "Opaque()"


junk: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    huge_ints,
    st.floats(),
    odd_floats,
    odd_text,
    st.text(max_size=4),
    st.binary(max_size=4),
    naive_times,
    aware_times,
    st.timedeltas(),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
    st.tuples(st.integers(0, 3)),
    st.frozensets(st.integers(0, 3), max_size=2),
    st.builds(Opaque),
)


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``valid``, sometimes junk."""
    return st.one_of(valid, valid, junk)


segments = st.text(alphabet=string.ascii_lowercase + "_-", min_size=1, max_size=4)
valid_topics = st.lists(segments, min_size=1, max_size=3).map(".".join)
long_names = st.sampled_from(["a" * 65, ".".join(["a" * 64] * 4), "a." * 127 + "a", "a" * 64])
topics = st.one_of(valid_topics, valid_topics, odd_text, long_names, junk)
pattern_words = st.one_of(segments, st.sampled_from(["*", "#", "a*", "#b", "", "**"]))
patterns = st.one_of(st.lists(pattern_words, min_size=1, max_size=4).map(".".join), topics)
pattern_lists = st.one_of(patterns, st.lists(patterns, max_size=3), junk)

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=8),
        odd_text,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=4), odd_text), inner, max_size=3),
    ),
    max_leaves=8,
)
payloads = st.one_of(json_values, st.binary(max_size=16), huge_ints, junk)
keys = st.one_of(st.none(), st.text(max_size=8), odd_text, st.just("k" * 256), junk)
durations = st.one_of(
    st.none(),
    st.integers(-2, 100),
    st.floats(min_value=-1, max_value=1e6),
    odd_floats,
    st.timedeltas(),
    huge_ints,
    junk,
)
small_ints = st.one_of(st.integers(-2, 12), huge_ints, junk)
headers = st.one_of(
    st.none(),
    st.dictionaries(
        st.one_of(st.text(max_size=4), odd_text), st.one_of(odd_text, junk), max_size=3
    ),
    st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=4), st.text(max_size=4)),
    junk,
)
content_types = st.one_of(
    st.none(), st.sampled_from(["application/json", "text/plain", "", "a\nb", "é"]), junk
)

publish_options = st.fixed_dictionaries(
    {},
    optional={
        "key": keys,
        "priority": small_ints,
        "delay": durations,
        "at": st.one_of(aware_times, naive_times, junk),
        "ttl": durations,
        "expires_at": st.one_of(aware_times, naive_times, junk),
        "max_attempts": st.one_of(st.integers(-1, 1002), junk),
        "headers": headers,
        "idempotency_key": keys,
        "dedupe_window": durations,
        "content_type": content_types,
    },
)
unknown_options = st.dictionaries(
    st.sampled_from(["colour", "Priority", "topic", "payload", "conn_", "x"]), junk, max_size=1
)


def publish_items() -> st.SearchStrategy[Any]:
    item = st.builds(
        lambda topic, payload, options, extra: (
            {"topic": topic, "payload": payload, **options} | extra
        ),
        topics,
        payloads,
        publish_options,
        st.one_of(st.just({}), st.just({}), unknown_options),
    )
    missing = st.sampled_from([{"topic": "t"}, {"payload": 1}, {}])
    return st.one_of(item, item, item, missing, junk)


batches = st.one_of(st.lists(publish_items(), max_size=4), junk)
deliveries = st.one_of(
    st.just(LIVE),
    st.lists(st.just(LIVE), max_size=3),
    st.lists(st.one_of(st.just(LIVE), junk), min_size=1, max_size=3),
    st.tuples(st.just(LIVE)),
    junk,
)
ids = st.one_of(
    st.none(), st.lists(st.one_of(st.integers(-1, 3), huge_ints, junk), max_size=3), junk
)
errors = st.one_of(st.none(), st.text(max_size=8), odd_text, st.just(ValueError("boom")), junk)


def values_of(strategies: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A random subset of keyword arguments."""
    return st.fixed_dictionaries({}, optional=strategies)


def walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, list | tuple):
        for item in value:
            yield from walk(item)
