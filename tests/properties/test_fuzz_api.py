"""Fuzzing every public entry point on SQLite and PostgreSQL at once (see fuzzing.py).

Each example runs one call on both backends: only ``ValidationError`` subclasses (or the
documented errors a test names) may escape, a refused call writes nothing, and both
backends answer with the same exception type and ``field``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sqlbroker
from properties.fuzzing import (
    Target,
    aware_times,
    batches,
    content_types,
    deliveries,
    durations,
    errors,
    headers,
    ids,
    junk,
    keys,
    naive_times,
    odd_text,
    pattern_lists,
    payloads,
    publish_options,
    same_on_both,
    small_ints,
    topics,
    values_of,
)
from properties.profiles import scaled

pytestmark = pytest.mark.postgres


def _open(url: str, clock: sqlbroker.ManualClock) -> Target:
    broker = sqlbroker.Broker(url, migrate=True, clock=clock)
    broker.subscribe("everything", "#")
    broker.publish("t", {"seed": 1}, idempotency_key="seed")
    broker.send_many("q", [{"seed": 2}, {"seed": 3}])
    broker.send("dying", 1)
    (dying,) = broker.claim("dying")
    broker.dead_letter(dying, reason="seeded")
    (delivery,) = broker.claim("q", lease=3600)
    return Target(
        name=broker.backend_name,
        url=url,
        broker=broker,
        async_broker=sqlbroker.AsyncBroker(url, clock=clock),
        delivery=delivery,
    )


@pytest.fixture(scope="module")
def targets(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Target]]:
    """A seeded SQLite and PostgreSQL broker sharing one stopped clock, for the module.

    The clock never moves, so windows and TTLs cannot run out between the two runs of one
    call. Every call applies to both, so their states stay alike.
    """
    cluster = request.getfixturevalue("pg_server")
    database = cluster.take_clone()
    clock = sqlbroker.ManualClock()
    opened = [
        _open(f"sqlite:///{tmp_path_factory.mktemp('fuzz')}/fuzz.db", clock),
        _open(cluster.url(database), clock),
    ]
    try:
        yield opened
    finally:
        for target in opened:
            asyncio.run(target.async_broker.close())
            target.broker.close()
        cluster.drop_later(database)


PUBLISH_ERRORS = (sqlbroker.IdempotencyConflict,)


# --- publishing ----------------------------------------------------------------------------------


@scaled(ci=120, long=5_000)
@given(topic=topics, payload=payloads, options=publish_options)
def test_publish(targets: list[Target], topic: Any, payload: Any, options: dict[str, Any]) -> None:
    same_on_both(targets, lambda t: t.broker.publish(topic, payload, **options), PUBLISH_ERRORS)


@scaled(ci=60, long=2_000)
@given(queue=topics, payload=payloads, options=publish_options)
def test_send(targets: list[Target], queue: Any, payload: Any, options: dict[str, Any]) -> None:
    same_on_both(targets, lambda t: t.broker.send(queue, payload, **options), PUBLISH_ERRORS)


@scaled(ci=80, long=3_000)
@given(messages=batches)
def test_publish_many(targets: list[Target], messages: Any) -> None:
    same_on_both(targets, lambda t: t.broker.publish_many(messages), PUBLISH_ERRORS)


@scaled(ci=60, long=2_000)
@given(
    queue=topics,
    items=st.one_of(st.lists(payloads, max_size=4), junk),
    options=publish_options,
)
def test_send_many(targets: list[Target], queue: Any, items: Any, options: dict[str, Any]) -> None:
    same_on_both(
        targets,
        lambda t: t.broker.send_many(queue, items, **options),
        PUBLISH_ERRORS,
    )


@scaled(ci=40, long=1_000)
@given(
    method=st.sampled_from(["publish", "send", "publish_many", "send_many", "complete", "release"]),
    which=deliveries,
    topic=topics,
    payload=payloads,
    options=publish_options,
    messages=batches,
)
def test_async_publishing(
    targets: list[Target],
    method: str,
    topic: Any,
    payload: Any,
    options: dict[str, Any],
    messages: Any,
    which: Any,
) -> None:
    def call(target: Target) -> Any:
        broker = target.async_broker
        if method == "complete":
            work: Any = broker.complete(target.resolve(which))
        elif method == "release":
            work = broker.release(target.resolve(which))
        elif method == "publish":
            work = broker.publish(topic, payload, **options)
        elif method == "send":
            work = broker.send(topic, payload, **options)
        elif method == "publish_many":
            work = broker.publish_many(messages)
        else:
            work = broker.send_many(topic, [payload], **options)
        return asyncio.run(work)

    same_on_both(targets, call, (*PUBLISH_ERRORS, sqlbroker.LeaseLost))


# --- subscriptions and subscribers ---------------------------------------------------------------


@scaled(ci=60, long=2_000)
@given(name=topics, pattern_list=pattern_lists, replace=st.one_of(st.booleans(), junk))
def test_subscribe(targets: list[Target], name: Any, pattern_list: Any, replace: Any) -> None:
    same_on_both(targets, lambda t: t.broker.subscribe(name, pattern_list, replace=replace))


def _handler(message: Any) -> None:
    """A subscriber handler (never run by these tests)."""


async def _async_handler(message: Any) -> None:
    """An async subscriber handler (never run by these tests)."""


@dataclass(frozen=True)
class PolicyRecipe:
    """The arguments of a ``RetryPolicy``, built inside the call (it is fuzzed too)."""

    options: dict[str, Any]


policy_options = values_of(
    {
        "max_attempts": st.one_of(st.none(), st.integers(-1, 1002), junk),
        "base": durations,
        "cap": durations,
        "jitter": st.one_of(st.sampled_from(["full", "none", "half"]), junk),
        "retry_on": st.one_of(st.just((ValueError,)), st.just((1,)), junk),
        "dead_on": st.one_of(st.just((KeyError,)), st.just([KeyError]), junk),
    }
)


@scaled(ci=80, long=3_000)
@given(
    handler=st.one_of(st.just(_handler), st.just(_async_handler), junk),
    name=st.one_of(st.none(), topics),
    where=st.one_of(
        st.fixed_dictionaries({"topics": pattern_lists}),
        st.fixed_dictionaries({"queue": topics}),
        st.fixed_dictionaries({"topics": pattern_lists, "queue": topics}),
        st.just({}),
    ),
    options=values_of(
        {
            "concurrency": small_ints,
            "prefetch": st.one_of(st.none(), small_ints),
            "lease": durations,
            "timeout": durations,
            "retry": st.one_of(st.none(), st.builds(PolicyRecipe, policy_options), junk),
            "ack": st.one_of(st.sampled_from(["auto", "manual", "AUTO"]), junk),
            "on_dead_letter": st.one_of(st.none(), st.just(_handler), junk),
        }
    ),
)
def test_subscriber_options(
    targets: list[Target], handler: Any, name: Any, where: Any, options: dict[str, Any]
) -> None:
    """Declaring a subscriber validates everything (and touches no database)."""

    def call(target: Target) -> None:
        chosen = dict(options)
        if isinstance(chosen.get("retry"), PolicyRecipe):
            chosen["retry"] = sqlbroker.RetryPolicy(**chosen["retry"].options)
        before = dict(target.broker.subscribers)
        try:
            target.broker.subscriber(name, **where, **chosen)(handler)
        finally:
            target.broker.subscribers.clear()
            target.broker.subscribers.update(before)

    same_on_both(targets, call)


# --- processed keys, schedules and sagas ---------------------------------------------------------


@scaled(ci=60, long=2_000)
@given(
    scope=topics,
    key=keys,
    options=values_of({"lease": durations, "window": durations}),
    forget=st.booleans(),
)
def test_once_and_forget(
    targets: list[Target], scope: Any, key: Any, options: dict[str, Any], forget: bool
) -> None:
    def call(target: Target) -> Any:
        if forget:
            return target.broker.forget(scope, key)
        with target.broker.once(scope, key, **options) as first:
            return first

    same_on_both(targets, call)


@scaled(ci=80, long=3_000)
@given(
    name=topics,
    topic=topics,
    payload=payloads,
    options=values_of(
        {
            "cron": st.one_of(
                st.sampled_from(["0 3 * * *", "*/5 * * * *", "61 * * * *", "", "@daily", "a b"]),
                odd_text,
                junk,
            ),
            "every": durations,
            "tz": st.one_of(
                st.sampled_from(["UTC", "Europe/Paris", "Mars/Olympus", "", "../etc"]), junk
            ),
            "missed": st.one_of(st.sampled_from(["latest", "skip", "all", "some"]), junk),
            "grace": durations,
            "start_at": st.one_of(aware_times, naive_times, junk),
            "headers": headers,
            "priority": small_ints,
            "key": keys,
            "ttl": durations,
            "max_attempts": st.one_of(st.integers(-1, 1002), junk),
            "content_type": content_types,
        }
    ),
)
def test_schedule(
    targets: list[Target], name: Any, topic: Any, payload: Any, options: dict[str, Any]
) -> None:
    same_on_both(targets, lambda t: t.broker.schedule(name, topic, payload, **options))


step_names = st.text("abc", min_size=1, max_size=3)


@dataclass(frozen=True)
class StepRecipe:
    """The arguments of one ``Step``, built inside the call (its constructor is fuzzed too)."""

    name: Any
    compensate: Any
    timeout: Any


step_lists = st.one_of(
    st.lists(st.one_of(step_names, topics), max_size=3),
    st.lists(
        st.builds(
            StepRecipe, st.one_of(step_names, topics), st.one_of(st.booleans(), junk), durations
        ),
        min_size=1,
        max_size=3,
    ),
    junk,
)


@scaled(ci=60, long=2_000)
@given(
    name=topics,
    steps=step_lists,
    timeout=st.one_of(st.just(None), durations),
    data=st.one_of(payloads, st.just({"order": 1})),
    saga_id=st.one_of(st.none(), keys),
)
def test_saga_start(
    targets: list[Target], name: Any, steps: Any, timeout: Any, data: Any, saga_id: Any
) -> None:
    def call(target: Target) -> str:
        built = steps
        if isinstance(steps, list):
            built = [
                sqlbroker.Step(s.name, compensate=s.compensate, timeout=s.timeout)
                if isinstance(s, StepRecipe)
                else s
                for s in steps
            ]
        options = {} if timeout is None else {"timeout": timeout}
        saga = sqlbroker.Saga(name, built, **options)
        return target.broker.sagas.start(saga, data, saga_id=saga_id)

    same_on_both(targets, call, (sqlbroker.SagaConflict,))


# --- dead letters --------------------------------------------------------------------------------

dead_filters = values_of(
    {
        "subscription": topics,
        "topic": topics,
        "error_type": st.one_of(st.text(max_size=4), odd_text, junk),
        "reason_contains": st.one_of(st.text(max_size=4), odd_text, junk),
        "dead_before": st.one_of(aware_times, naive_times, junk),
        "dead_after": st.one_of(aware_times, naive_times, junk),
    }
)


@scaled(ci=80, long=3_000)
@given(
    action=st.sampled_from(["list", "get", "replay", "purge"]),
    selection=ids,
    filters=dead_filters,
    extra=values_of(
        {
            "all": st.one_of(st.booleans(), junk),
            "actor": st.one_of(st.text(max_size=4), odd_text, junk),
            "note": st.one_of(st.text(max_size=4), odd_text, junk),
        }
    ),
    paging=values_of({"limit": small_ints, "after_id": st.one_of(st.none(), small_ints)}),
    dead_id=st.one_of(
        st.integers(10**6, 10**7), st.integers(-1, 0), st.integers(2**63, 2**70), junk
    ),
)
def test_dead_letter_admin(
    targets: list[Target],
    action: str,
    selection: Any,
    filters: dict[str, Any],
    extra: dict[str, Any],
    paging: dict[str, Any],
    dead_id: Any,
) -> None:
    def call(target: Target) -> Any:
        dead = target.broker.dead_letters
        if action == "list":
            return dead.list(**filters, **paging)
        if action == "get":
            return dead.get(dead_id)
        if action == "replay":
            return dead.replay(selection, **filters, **extra)
        return dead.purge(selection, **filters, **extra)

    same_on_both(targets, call, (sqlbroker.NotFound,))


# --- the low-level consumer API ------------------------------------------------------------------


@scaled(ci=120, long=5_000)
@given(
    action=st.sampled_from(
        ["claim", "complete", "retry", "extend", "dead_letter", "release", "cancel"]
    ),
    which=deliveries,
    subscription=st.one_of(st.just("q"), topics),
    options=values_of(
        {"limit": small_ints, "lease": durations, "worker": st.one_of(st.none(), odd_text, junk)}
    ),
    after=durations,
    lease=durations,
    reason=st.one_of(st.text(max_size=6), odd_text, junk),
    error=errors,
    message_id=st.one_of(st.uuids().map(str), odd_text, junk),
)
def test_consumer_calls(
    targets: list[Target],
    action: str,
    which: Any,
    subscription: Any,
    options: dict[str, Any],
    after: Any,
    lease: Any,
    reason: Any,
    error: Any,
    message_id: Any,
) -> None:
    def call(target: Target) -> Any:
        broker, delivery = target.broker, target.resolve(which)
        if action == "claim":
            return broker.claim(subscription, **options)
        if action == "complete":
            return broker.complete(delivery)
        if action == "retry":
            return broker.retry(delivery, after=after, error=error)
        if action == "extend":
            return broker.extend(delivery, lease=lease)
        if action == "dead_letter":
            return broker.dead_letter(delivery, reason=reason, error=error)
        if action == "release":
            return broker.release(delivery)
        return broker.cancel(message_id)

    same_on_both(targets, call, (sqlbroker.LeaseLost,))


@scaled(ci=60, long=2_000)
@given(
    action=st.sampled_from(
        ["pending", "archive", "stats", "series", "audit", "reap", "unrouted", "unsubscribe"]
    ),
    subscription=st.one_of(st.none(), topics),
    state=st.one_of(st.none(), st.sampled_from(["available", "running", "sleeping"]), junk),
    outcome=st.one_of(st.none(), st.sampled_from(["completed", "expired", "lost"]), junk),
    message_id=st.one_of(st.none(), st.uuids().map(str), odd_text, junk),
    limit=small_ints,
    window=durations,
    before_id=st.one_of(st.none(), small_ints),
)
def test_inspection_calls(
    targets: list[Target],
    action: str,
    subscription: Any,
    state: Any,
    outcome: Any,
    message_id: Any,
    limit: Any,
    window: Any,
    before_id: Any,
) -> None:
    def call(target: Target) -> Any:
        broker = target.broker
        if action == "pending":
            return broker.pending(subscription, state=state, limit=limit)
        if action == "archive":
            return broker.archive(subscription, outcome=outcome, message_id=message_id, limit=limit)
        if action == "stats":
            return broker.stats(window=window)
        if action == "series":
            return broker.metrics_series(minutes=limit)
        if action == "audit":
            return broker.audit(limit=limit, before_id=before_id)
        if action == "reap":
            return broker.reap(limit=limit)
        if action == "unrouted":
            return broker.unrouted(window=window)
        if subscription in ("everything", "q", "dying"):
            return None  # keep the seeded subscriptions
        return broker.unsubscribe(subscription)

    same_on_both(targets, call)


# --- Broker(url, options) ------------------------------------------------------------------------

broker_options = values_of(
    {
        "migrate": st.one_of(st.booleans(), st.none()),
        "lease": durations,
        "max_attempts": st.one_of(st.integers(-1, 1002), junk),
        "dedupe_window": durations,
        "payload_limit": st.one_of(st.integers(-1, 2**21), junk),
        "pool_size": st.one_of(st.integers(-1, 300), junk),
        "clock": st.one_of(st.just(sqlbroker.ManualClock()), junk),
        "colour": junk,
    }
)


@scaled(ci=40, long=1_000)
@given(options=broker_options)
def test_broker_options(targets: list[Target], options: dict[str, Any]) -> None:
    """The options both backends share answer alike (backend-specific ones are checked per
    backend in ``test_backend_options``)."""

    def call(target: Target) -> None:
        sqlbroker.Broker(target.url, **options).close()

    same_on_both(targets, call)


@scaled(ci=40, long=1_000)
@given(
    sqlite=values_of(
        {
            "synchronous": st.one_of(st.sampled_from(["full", "normal", "off"]), junk),
            "busy_timeout": durations,
            "schema": junk,
        }
    ),
    postgres=values_of(
        {
            "schema": st.one_of(st.sampled_from(["app", "App", "1x", "a" * 64]), junk),
            "synchronous_commit": st.one_of(st.sampled_from(["on", "off", "local"]), junk),
            "connect_timeout": durations,
            "application_name": st.one_of(odd_text, junk),
            "busy_timeout": junk,
        }
    ),
)
def test_backend_options(
    targets: list[Target], sqlite: dict[str, Any], postgres: dict[str, Any]
) -> None:
    for target in targets:
        options = sqlite if target.name == "sqlite" else postgres
        refused: sqlbroker.ValidationError | None = None
        try:
            sqlbroker.Broker(target.url, **options).close()
        except sqlbroker.ValidationError as error:
            refused = error
        if refused is not None:
            assert str(refused).startswith(f"{refused.field}: ")


url_texts = st.builds(
    lambda prefix, rest: prefix + rest,
    st.sampled_from(
        [
            "sqlite:///",
            "sqlite://",
            "sqlite:////",
            "SQLite:///",
            "postgresql://",
            "postgres://u:p@",
            "postgresql://h:99999/",
            "mysql://",
            "",
            "sqlite:///%00",
            "sqlite:///:memory:",
        ]
    ),
    st.one_of(odd_text, st.sampled_from(["", "?mode=ro", ":memory:", "db?x=%zz", "a/../b"])),
)


@scaled(ci=60, long=2_000)
@given(url=st.one_of(url_texts, junk))
def test_broker_urls(tmp_path_factory: pytest.TempPathFactory, url: Any) -> None:
    """Constructing a broker from any URL: a broker, or ``ConfigurationError``/validation
    — or, for a path SQLite cannot open (a SQLite broker opens its file and creates its
    schema at once), a ``StorageError``. Relative paths land in a scratch directory."""
    with (
        contextlib.chdir(tmp_path_factory.mktemp("urls")),
        contextlib.suppress(
            sqlbroker.ConfigurationError, sqlbroker.ValidationError, sqlbroker.StorageError
        ),
    ):
        sqlbroker.Broker(url).close()


def test_the_fuzzers_reach_success_and_refusal(targets: list[Target]) -> None:
    """The strategies are not all junk: a plain publish passes on both, junk is refused."""
    assert same_on_both(targets, lambda t: t.broker.publish("a.b", {"x": 1})).outcome == "ok"
    refused = same_on_both(targets, lambda t: t.broker.publish("a..b", 1))
    assert (refused.outcome, refused.field) == ("InvalidName", "topic")
