"""The bad-input table (DESIGN §2.10): every bad argument raises a ``ValidationError``
subclass naming the offending field, before any SQL runs, identically on both backends, and
writes nothing."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

import sqlbroker
from helpers import table_counts

LIMIT = 256 * 1024
NUL = "\x00"
LONE_SURROGATE = "\ud800"
OVERLONG_NAME = ".".join(["a" * 64, "b" * 64, "c" * 64, "d" * 61])  # 256 characters
assert len(OVERLONG_NAME) == 256

Op = Callable[[sqlbroker.Broker, sqlbroker.Delivery], Any]


@dataclass(frozen=True)
class Case:
    id: str
    op: Op
    field: str
    error: type[sqlbroker.ValidationError] = sqlbroker.ValidationError


def publish(payload: Any = None, topic: str = "t", **options: Any) -> Op:
    return lambda broker, _: broker.publish(topic, payload, **options)


def send(payload: Any = None, queue: str = "q", **options: Any) -> Op:
    return lambda broker, _: broker.send(queue, payload, **options)


def _deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


BAD_TOPICS = [
    ("empty", ""),
    ("overlong-256", OVERLONG_NAME),
    ("long-segment", "a" * 65),
    ("double-dot", "a..b"),
    ("leading-dot", ".a"),
    ("trailing-dot", "a."),
    ("space", "a b"),
    ("star", "a*"),
    ("lone-star", "*"),
    ("hash", "#"),
    ("sql-injection", "x'; DROP TABLE sqlbroker_message; --"),
    ("double-quote", 'a"b'),
    ("non-ascii", "ü"),
    ("percent", "%"),
    ("nul", "a\x00b"),
    ("newline", "a\nb"),
    ("not-a-string", 42),
    ("bytes", b"topic"),
]

PAYLOAD_CASES = [
    Case("payload-object", publish(object()), "payload", sqlbroker.InvalidPayload),
    Case("payload-set", publish({1, 2}), "payload", sqlbroker.InvalidPayload),
    Case("payload-datetime", publish(datetime(2024, 1, 1)), "payload", sqlbroker.InvalidPayload),
    Case(
        "payload-nested-datetime",
        publish({"at": [datetime(2024, 1, 1)]}),
        "payload",
        sqlbroker.InvalidPayload,
    ),
    Case("payload-nan", publish(math.nan), "payload", sqlbroker.InvalidPayload),
    Case("payload-inf", publish(math.inf), "payload", sqlbroker.InvalidPayload),
    Case("payload-minus-inf", publish(-math.inf), "payload", sqlbroker.InvalidPayload),
    Case(
        "payload-nested-nan",
        publish({"a": [1, {"b": math.nan}]}),
        "payload",
        sqlbroker.InvalidPayload,
    ),
    Case("payload-nested-inf", publish([[math.inf]]), "payload", sqlbroker.InvalidPayload),
    Case("payload-nul-in-string", publish("a" + NUL + "b"), "payload", sqlbroker.InvalidPayload),
    Case(
        "payload-nul-in-nested-string",
        publish({"k": ["ok", NUL]}),
        "payload",
        sqlbroker.InvalidPayload,
    ),
    Case("payload-nul-in-key", publish({"a" + NUL: 1}), "payload", sqlbroker.InvalidPayload),
    Case("payload-lone-surrogate", publish(LONE_SURROGATE), "payload", sqlbroker.InvalidPayload),
    Case(
        "payload-lone-surrogate-key",
        publish({LONE_SURROGATE: 1}),
        "payload",
        sqlbroker.InvalidPayload,
    ),
    Case("payload-int-key", publish({1: "x"}), "payload", sqlbroker.InvalidPayload),
    Case("payload-none-key", publish({None: "x"}), "payload", sqlbroker.InvalidPayload),
    Case("payload-tuple-key", publish({(1, 2): "x"}), "payload", sqlbroker.InvalidPayload),
    Case("payload-too-deep", publish(_deep(65)), "payload", sqlbroker.InvalidPayload),
    Case("payload-huge-int", publish(10**5000), "payload", sqlbroker.InvalidPayload),
    Case(
        "payload-json-one-byte-over",
        publish("x" * (LIMIT - 1)),
        "payload",
        sqlbroker.InvalidPayload,
    ),
    Case(
        "payload-utf8-one-byte-over",
        publish("é" * (LIMIT // 2 - 1) + "x"),
        "payload",
        sqlbroker.InvalidPayload,
    ),
    Case(
        "payload-bytes-one-byte-over",
        publish(b"x" * (LIMIT + 1)),
        "payload",
        sqlbroker.InvalidPayload,
    ),
    Case(
        "payload-over-limit-via-send", send("x" * (LIMIT - 1)), "payload", sqlbroker.InvalidPayload
    ),
    *(
        Case(
            f"payload-json-bytes-{name}",
            publish(data, content_type="application/json"),
            "payload",
            sqlbroker.InvalidPayload,
        )
        for name, data in [
            ("empty", b""),
            ("not-json", b"{not json"),
            ("trailing-garbage", b"[1] [2]"),
            ("not-utf8", b'"\xff"'),
            ("utf16", '"x"'.encode("utf-16")),
            ("nan", b"NaN"),
            ("nested-infinity", b'{"a": [-Infinity]}'),
            ("overflowing-float", b"1e999"),
            ("nul", b'"a\\u0000b"'),
            ("nul-in-key", b'{"\\u0000": 1}'),
            ("lone-surrogate", b'["\\ud800"]'),
            ("too-deep", b"[" * 66 + b"]" * 66),
            ("recursion-deep", b"[" * 100_000 + b"]" * 100_000),
            ("huge-int", b"1" * 5000),
        ]
    ),
    Case(
        "send-many-json-bytes-item-2",
        lambda b, _: b.send_many("q", [b"[1]", b"[2]", b"[3"], content_type="application/json"),
        "messages[2].payload",
        sqlbroker.InvalidPayload,
    ),
    Case("content-type-with-json", publish({"a": 1}, content_type="image/png"), "content_type"),
    Case("content-type-empty", publish(b"x", content_type=""), "content_type"),
    Case("content-type-non-ascii", publish(b"x", content_type="täxt/plain"), "content_type"),
    Case("content-type-newline", publish(b"x", content_type="text/plain\nX: y"), "content_type"),
    Case("content-type-not-str", publish(b"x", content_type=7), "content_type"),
]

NAME_CASES = [
    *(
        Case(f"topic-{name}", publish(1, topic=value), "topic", sqlbroker.InvalidName)
        for name, value in BAD_TOPICS
    ),
    *(
        Case(f"queue-{name}", send(1, queue=value), "queue", sqlbroker.InvalidName)
        for name, value in BAD_TOPICS
    ),
    *(
        Case(
            f"send-many-queue-{name}",
            lambda b, _, v=value: b.send_many(v, [1]),
            "queue",
            sqlbroker.InvalidName,
        )
        for name, value in BAD_TOPICS
    ),
    *(
        Case(
            f"subscribe-name-{name}",
            lambda b, _, v=value: b.subscribe(v, "x"),
            "name",
            sqlbroker.InvalidName,
        )
        for name, value in BAD_TOPICS
    ),
    *(
        Case(
            f"claim-subscription-{name}",
            lambda b, _, v=value: b.claim(v),
            "subscription",
            sqlbroker.InvalidName,
        )
        for name, value in BAD_TOPICS
    ),
    *(
        Case(
            f"pattern-{name}",
            lambda b, _, v=value: b.subscribe("s", v),
            "patterns",
            sqlbroker.InvalidName,
        )
        for name, value in [
            ("star-inside-segment", "a.*b"),
            ("double-hash", "a.##"),
            ("empty", ""),
            ("hash-inside-segment", "a#.b"),
            ("empty-segment", "a..*"),
            ("trailing-dot", "#."),
            ("space", "a .*"),
            ("overlong", "*." + OVERLONG_NAME[2:] + "a"),
            ("sql", "'; --"),
        ]
    ),
    Case(
        "pattern-in-list",
        lambda b, _: b.subscribe("s", ["ok.*", "bad.*x"]),
        "patterns",
        sqlbroker.InvalidName,
    ),
    Case("patterns-empty-list", lambda b, _: b.subscribe("s", []), "patterns"),
    Case("subscribe-replace-str", lambda b, _: b.subscribe("s", "x", replace="no"), "replace"),
    Case("subscribe-replace-int", lambda b, _: b.subscribe("s", "x", replace=1), "replace"),
    Case(
        "patterns-too-many",
        lambda b, _: b.subscribe("s", [f"p{i}" for i in range(101)]),
        "patterns",
    ),
]

OPTION_CASES = [
    *(
        Case(f"priority-{name}", send(1, priority=value), "priority", sqlbroker.InvalidPriority)
        for name, value in [
            ("minus-1", -1),
            ("10", 10),
            ("2.5", 2.5),
            ("true", True),
            ("str", "1"),
            ("none", None),
        ]
    ),
    *(
        Case(f"{field}-{name}", send(1, **{field: value}), field, sqlbroker.InvalidDuration)
        for field in ("delay", "ttl")
        for name, value in [
            ("negative", -1),
            ("negative-timedelta", timedelta(seconds=-1)),
            ("nan", math.nan),
            ("inf", math.inf),
            ("minus-inf", -math.inf),
            ("huge", 1e12),
            ("huge-timedelta", timedelta(days=20 * 365)),
            ("str", "5"),
            ("bool", True),
            ("list", [5]),
        ]
    ),
    Case("ttl-zero", send(1, ttl=0), "ttl", sqlbroker.InvalidDuration),
    Case("ttl-before-delay-ends", send(1, delay=10, ttl=5), "ttl", sqlbroker.InvalidDuration),
    Case("ttl-equals-delay", send(1, delay=5, ttl=5), "ttl", sqlbroker.InvalidDuration),
    Case(
        "expires-at-equals-at",
        send(1, at=datetime(2030, 1, 1).astimezone(), expires_at=datetime(2030, 1, 1).astimezone()),
        "expires_at",
        sqlbroker.InvalidTime,
    ),
    Case(
        "expires-at-before-at",
        send(1, at=datetime(2030, 1, 2).astimezone(), expires_at=datetime(2030, 1, 1).astimezone()),
        "expires_at",
        sqlbroker.InvalidTime,
    ),
    Case("delay-and-at", send(1, delay=1, at=datetime(2030, 1, 1).astimezone()), "at"),
    Case("at-naive", send(1, at=datetime(2030, 1, 1)), "at", sqlbroker.InvalidTime),
    Case("at-not-datetime", send(1, at="2030-01-01"), "at", sqlbroker.InvalidTime),
    Case(
        "at-out-of-range",
        send(1, at=datetime(9999, 1, 1).astimezone()),
        "at",
        sqlbroker.InvalidTime,
    ),
    Case(
        "expires-at-naive",
        send(1, expires_at=datetime(2030, 1, 1)),
        "expires_at",
        sqlbroker.InvalidTime,
    ),
    Case(
        "ttl-and-expires-at",
        send(1, ttl=5, expires_at=datetime(2030, 1, 1).astimezone()),
        "expires_at",
    ),
    Case("max-attempts-zero", send(1, max_attempts=0), "max_attempts"),
    Case("max-attempts-huge", send(1, max_attempts=10**6), "max_attempts"),
    Case("max-attempts-float", send(1, max_attempts=2.0), "max_attempts"),
    Case("dedupe-window-zero", send(1, idempotency_key="k", dedupe_window=0), "dedupe_window"),
    Case(
        "dedupe-window-nan", send(1, idempotency_key="k", dedupe_window=math.nan), "dedupe_window"
    ),
    Case("headers-int-value", send(1, headers={"a": 1}), "headers", sqlbroker.InvalidHeaders),
    Case("headers-none-value", send(1, headers={"a": None}), "headers", sqlbroker.InvalidHeaders),
    Case("headers-bytes-value", send(1, headers={"a": b"v"}), "headers", sqlbroker.InvalidHeaders),
    Case("headers-int-key", send(1, headers={1: "v"}), "headers", sqlbroker.InvalidHeaders),
    Case("headers-empty-key", send(1, headers={"": "v"}), "headers", sqlbroker.InvalidHeaders),
    Case(
        "headers-nul-value", send(1, headers={"a": "x" + NUL}), "headers", sqlbroker.InvalidHeaders
    ),
    Case("headers-nul-key", send(1, headers={"a" + NUL: "v"}), "headers", sqlbroker.InvalidHeaders),
    Case(
        "headers-newline-key", send(1, headers={"a\nb": "v"}), "headers", sqlbroker.InvalidHeaders
    ),
    Case(
        "headers-surrogate-value",
        send(1, headers={"a": LONE_SURROGATE}),
        "headers",
        sqlbroker.InvalidHeaders,
    ),
    Case("headers-not-mapping", send(1, headers=[("a", "b")]), "headers", sqlbroker.InvalidHeaders),
    Case(
        "headers-too-many",
        send(1, headers={f"h{i}": "v" for i in range(65)}),
        "headers",
        sqlbroker.InvalidHeaders,
    ),
    Case(
        "idempotency-key-empty",
        send(1, idempotency_key=""),
        "idempotency_key",
        sqlbroker.InvalidName,
    ),
    Case(
        "idempotency-key-256",
        send(1, idempotency_key="k" * 256),
        "idempotency_key",
        sqlbroker.InvalidName,
    ),
    Case(
        "idempotency-key-nul",
        send(1, idempotency_key="a" + NUL),
        "idempotency_key",
        sqlbroker.InvalidName,
    ),
    Case(
        "idempotency-key-int", send(1, idempotency_key=5), "idempotency_key", sqlbroker.InvalidName
    ),
    Case("ordering-key-empty", send(1, key=""), "key", sqlbroker.InvalidName),
    Case("ordering-key-nul", send(1, key=NUL), "key", sqlbroker.InvalidName),
]

BATCH_CASES = [
    Case(
        "batch-10001",
        lambda b, _: b.publish_many([{"topic": "t", "payload": i} for i in range(10_001)]),
        "messages",
    ),
    Case("send-many-10001", lambda b, _: b.send_many("q", list(range(10_001))), "messages"),
    Case("batch-not-a-list", lambda b, _: b.publish_many({"topic": "t", "payload": 1}), "messages"),
    Case("batch-str", lambda b, _: b.publish_many("topic"), "messages"),
    Case("batch-item-not-mapping", lambda b, _: b.publish_many([("t", 1)]), "messages[0]"),
    Case(
        "batch-item-missing-payload", lambda b, _: b.publish_many([{"topic": "t"}]), "messages[0]"
    ),
    Case(
        "batch-item-unknown-field",
        lambda b, _: b.publish_many([{"topic": "t", "payload": 1, "x": 2}]),
        "messages[0]",
    ),
    *(
        Case(
            f"batch-item-3-{name}",
            lambda b, _, item=item: b.publish_many(
                [{"topic": "t", "payload": i} for i in range(3)]
                + [item]
                + [{"topic": "t", "payload": 4}]
            ),
            field,
        )
        for name, item, field in [
            ("payload", {"topic": "t", "payload": math.nan}, "messages[3].payload"),
            ("topic", {"topic": "a..b", "payload": 1}, "messages[3].topic"),
            ("priority", {"topic": "t", "payload": 1, "priority": 10}, "messages[3].priority"),
            ("headers", {"topic": "t", "payload": 1, "headers": {"a": 1}}, "messages[3].headers"),
            ("delay", {"topic": "t", "payload": 1, "delay": -1}, "messages[3].delay"),
        ]
    ),
    Case(
        "send-many-item-3",
        lambda b, _: b.send_many("q", [0, 1, 2, {1, 2}, 4]),
        "messages[3].payload",
    ),
]

CONSUMER_CASES = [
    # Stored results (docs/results.md): a value that cannot be stored settles nothing.
    *(
        Case(
            f"complete-result-{name}",
            lambda b, d, v=value: b.complete(d, result=v),
            "result",
            sqlbroker.InvalidPayload,
        )
        for name, value in [
            ("set", {1, 2}),
            ("nan", math.nan),
            ("bytes", b"raw"),
            ("over-the-limit", "x" * LIMIT),
        ]
    ),
    Case(
        "complete-result-two-deliveries",
        lambda b, d: b.complete([d, d], result=1),
        "deliveries",
        sqlbroker.InvalidOption,
    ),
    Case("result-bad-id", lambda b, _: b.result("nope"), "message_id", sqlbroker.InvalidName),
    Case(
        "result-negative-wait",
        lambda b, d: b.result(d.message_id, wait=-1),
        "wait",
        sqlbroker.InvalidDuration,
    ),
    *(
        Case(
            f"claim-lease-{name}",
            lambda b, _, v=value: b.claim("q", lease=v),
            "lease",
            sqlbroker.InvalidDuration,
        )
        for name, value in [
            ("zero", 0),
            ("negative", -5),
            ("huge", 1e9),
            ("over-a-day", 24 * 3600 + 1),
            ("nan", math.nan),
            ("str", "30"),
        ]
    ),
    *(
        Case(
            f"claim-limit-{name}",
            lambda b, _, v=value: b.claim("q", limit=v),
            "limit",
            sqlbroker.InvalidOption,
        )
        for name, value in [
            ("zero", 0),
            ("1001", 1001),
            ("negative", -1),
            ("float", 1.0),
            ("bool", True),
        ]
    ),
    Case("claim-worker-empty", lambda b, _: b.claim("q", worker=""), "worker"),
    Case("claim-worker-long", lambda b, _: b.claim("q", worker="w" * 201), "worker"),
    Case("claim-worker-nul", lambda b, _: b.claim("q", worker="w" + NUL), "worker"),
    Case("claim-worker-surrogate", lambda b, _: b.claim("q", worker=LONE_SURROGATE), "worker"),
    Case("claim-worker-newline", lambda b, _: b.claim("q", worker="w\nx"), "worker"),
    Case("claim-worker-int", lambda b, _: b.claim("q", worker=7), "worker"),
    Case("complete-str", lambda b, _: b.complete("delivery"), "deliveries"),
    Case("complete-list-of-ids", lambda b, d: b.complete([d.id]), "deliveries"),
    Case("release-dict", lambda b, _: b.release({}), "deliveries"),
    Case(
        "retry-after-negative",
        lambda b, d: b.retry(d, after=-1),
        "after",
        sqlbroker.InvalidDuration,
    ),
    Case(
        "retry-after-nan",
        lambda b, d: b.retry(d, after=math.nan),
        "after",
        sqlbroker.InvalidDuration,
    ),
    Case(
        "retry-after-huge", lambda b, d: b.retry(d, after=1e12), "after", sqlbroker.InvalidDuration
    ),
    Case(
        "extend-lease-zero", lambda b, d: b.extend(d, lease=0), "lease", sqlbroker.InvalidDuration
    ),
    Case(
        "extend-lease-huge", lambda b, d: b.extend(d, lease=1e9), "lease", sqlbroker.InvalidDuration
    ),
    Case("dead-letter-empty-reason", lambda b, d: b.dead_letter(d, reason=""), "reason"),
    Case("dead-letter-blank-reason", lambda b, d: b.dead_letter(d, reason="   "), "reason"),
    Case("dead-letter-nul-reason", lambda b, d: b.dead_letter(d, reason="a" + NUL), "reason"),
    Case("cancel-empty", lambda b, _: b.cancel(""), "message_id"),
    Case("cancel-int", lambda b, _: b.cancel(5), "message_id"),
    Case("cancel-not-a-uuid", lambda b, _: b.cancel("not-a-uuid"), "message_id"),
    Case("pause-empty", lambda b, _: b.pause(""), "name", sqlbroker.InvalidName),
    Case("pause-int", lambda b, _: b.pause(5), "name", sqlbroker.InvalidName),
    Case("pause-wildcard", lambda b, _: b.pause("q.*"), "name", sqlbroker.InvalidName),
    Case("pause-blank-actor", lambda b, _: b.pause("q", actor="  "), "actor"),
    Case("resume-nul-note", lambda b, _: b.resume("q", note="a" + NUL), "note"),
    Case("archive-message-id-not-a-uuid", lambda b, _: b.archive(message_id="nope"), "message_id"),
    Case("reap-limit-zero", lambda b, _: b.reap(limit=0), "limit"),
    Case("pending-state", lambda b, _: b.pending(state="sleeping"), "state"),
    Case("pending-limit", lambda b, _: b.pending(limit=0), "limit"),
    Case("archive-outcome", lambda b, _: b.archive(outcome="lost"), "outcome"),
    Case("unsubscribe-bad-name", lambda b, _: b.unsubscribe("a..b"), "name", sqlbroker.InvalidName),
]

DEAD_LETTER_CASES = [
    Case("dead-replay-no-selector", lambda b, _: b.dead_letters.replay(), "ids"),
    Case("dead-purge-no-selector", lambda b, _: b.dead_letters.purge(), "ids"),
    Case(
        "dead-replay-all-and-filter", lambda b, _: b.dead_letters.replay(all=True, topic="t"), "all"
    ),
    Case("dead-replay-id-zero", lambda b, _: b.dead_letters.replay([0]), "ids"),
    Case("dead-replay-ids-int", lambda b, _: b.dead_letters.replay(5), "ids"),
    Case("dead-replay-empty-actor", lambda b, _: b.dead_letters.replay([1], actor=""), "actor"),
    Case("dead-get-zero", lambda b, _: b.dead_letters.get(0), "id"),
    Case("dead-get-str", lambda b, _: b.dead_letters.get("1"), "id"),
    Case(
        "dead-list-error-type-empty", lambda b, _: b.dead_letters.list(error_type=""), "error_type"
    ),
    Case(
        "dead-list-reason-nul",
        lambda b, _: b.dead_letters.list(reason_contains=NUL),
        "reason_contains",
    ),
    Case(
        "dead-list-error-type-surrogate",
        lambda b, _: b.dead_letters.list(error_type="\udc80"),
        "error_type",
    ),
    Case(
        "dead-list-reason-surrogate",
        lambda b, _: b.dead_letters.list(reason_contains=LONE_SURROGATE),
        "reason_contains",
    ),
    Case(
        "dead-purge-reason-surrogate",
        lambda b, _: b.dead_letters.purge(reason_contains=LONE_SURROGATE),
        "reason_contains",
    ),
    Case("dead-list-bad-topic", lambda b, _: b.dead_letters.list(topic="a..b"), "topic"),
    Case(
        "dead-list-naive-time",
        lambda b, _: b.dead_letters.list(dead_before=datetime(2030, 1, 1)),
        "dead_before",
    ),
    Case("dead-list-limit", lambda b, _: b.dead_letters.list(limit=0), "limit"),
]

SAGA = sqlbroker.Saga("checkout", ["reserve", "charge"])


def start_saga(data: Any, **options: Any) -> Op:
    return lambda broker, _: broker.sagas.start(SAGA, data, **options)


SAGA_CASES = [
    *(
        Case(f"saga-data-{name}", start_saga(data), "data", sqlbroker.InvalidPayload)
        for name, data in [
            ("object", {"x": object()}),
            ("nan", {"amount": math.nan}),
            ("nul-in-string", {"note": "a" + NUL + "b"}),
            ("nul-in-key", {"a" + NUL: 1}),
            ("lone-surrogate", {"city": LONE_SURROGATE}),
            ("lone-surrogate-key", {LONE_SURROGATE: 1}),
            ("int-key", {1: "x"}),
            ("too-deep", _deep(65)),
            ("huge-int", 10**5000),
            ("one-byte-over", "x" * (LIMIT - 1)),
            ("bytes", b"raw"),
        ]
    ),
    Case("saga-id-int", start_saga({}, saga_id=7), "saga_id", sqlbroker.InvalidName),
    Case("saga-id-nul", start_saga({}, saga_id="a" + NUL), "saga_id", sqlbroker.InvalidName),
]

CASES = (
    PAYLOAD_CASES
    + NAME_CASES
    + OPTION_CASES
    + BATCH_CASES
    + CONSUMER_CASES
    + DEAD_LETTER_CASES
    + SAGA_CASES
)
assert len({case.id for case in CASES}) == len(CASES), "case ids must be unique"


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
    ids=["sqlite", "postgresql"],
)
def seeded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[sqlbroker.Broker, sqlbroker.Delivery]]:
    """One broker per backend for the whole table, with some state (so "nothing written"
    is not trivially an empty database) and a live delivery for the consumer-side cases.

    Sharing is sound because every case takes its own before/after snapshot; it keeps the
    several hundred cases from cloning a database each.
    """
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('bad_input')}/test.db"
        name = None
    else:
        cluster = request.getfixturevalue("pg_server")
        name = cluster.take_clone()
        url = cluster.url(name)
    try:
        with sqlbroker.Broker(url, migrate=True) as broker:
            broker.subscribe("everything", "#")
            broker.publish("t", {"seed": 1}, idempotency_key="seed")
            broker.send("q", {"seed": 2})
            broker.send("q", {"seed": 3})
            (delivery,) = broker.claim("q", lease=3600)
            yield broker, delivery
    finally:
        if name is not None:
            cluster.drop_later(name)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_bad_input_is_refused_before_sql(
    seeded: tuple[sqlbroker.Broker, sqlbroker.Delivery], case: Case
) -> None:
    broker, delivery = seeded
    counts_before = table_counts(broker.backend)
    pending_before = broker.pending()
    with pytest.raises(sqlbroker.ValidationError) as caught:
        case.op(broker, delivery)
    assert isinstance(caught.value, case.error), (
        f"{type(caught.value).__name__} is not a {case.error.__name__}"
    )
    assert caught.value.field == case.field, str(caught.value)
    assert str(caught.value).startswith(f"{case.field}: ")
    assert isinstance(caught.value, ValueError)
    assert table_counts(broker.backend) == counts_before
    assert broker.pending() == pending_before


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"payload_limit": 0}, "payload_limit"),
        ({"payload_limit": 1024 * 1024 + 1}, "payload_limit"),
        ({"payload_limit": True}, "payload_limit"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"lease": 0}, "lease"),
        ({"lease": math.inf}, "lease"),
        ({"dedupe_window": -1}, "dedupe_window"),
    ],
    ids=lambda value: (
        "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None
    ),
)
def test_bad_broker_options(backend_url: str, options: dict[str, Any], field: str) -> None:
    with pytest.raises(sqlbroker.ValidationError) as caught:
        sqlbroker.Broker(backend_url, **options)
    assert caught.value.field == field


def test_the_limit_is_configurable_to_the_byte(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True, payload_limit=10) as small:
        small.send("q", "x" * 8)  # 10 bytes encoded
        before = table_counts(small.backend)
        with pytest.raises(sqlbroker.InvalidPayload) as caught:
            small.send("q", "x" * 9)
        assert caught.value.field == "payload"
        assert table_counts(small.backend) == before


def test_valid_edge_values_are_accepted(broker: sqlbroker.Broker) -> None:
    """The other side of the table: the boundaries themselves are valid."""
    longest = ".".join(["a" * 64, "b" * 64, "c" * 64, "d" * 60])
    assert len(longest) == 255
    broker.send(longest, 1)
    broker.send("under_score-and-dash.Mixed09", 2)
    broker.send("q", "x" * (LIMIT - 2))
    broker.send("q", 0, priority=0)
    broker.send("q", 9, priority=9)
    broker.send("q", 1, delay=0, idempotency_key="k" * 255, headers={"h": ""})
    broker.send("q", 1, ttl=10 * 366 * 86400.0)
    broker.subscribe("s", ["#", "*", "a.#.b", "*.*.#"])
    assert len(broker.claim("q", limit=1000, lease=24 * 3600)) == 5
    assert len(broker.claim(longest, limit=1)) == 1


def test_a_wrong_deliveries_argument_says_what_is_wanted_and_what_came(
    broker: sqlbroker.Broker,
) -> None:
    """The consumer's deliveries share the one rule of argument lists (a string, bytes or
    a mapping is not a list of them), and its message names both."""
    wanted = "must be a list of Delivery objects (or one Delivery)"
    for op, said in [
        (lambda: broker.complete("d"), f"deliveries: {wanted}, not str"),
        (lambda: broker.release({}), f"deliveries: {wanted}, not dict"),
        (lambda: broker.retry(b"d"), f"delivery: {wanted}, not bytes"),
        (lambda: broker.complete(7), f"deliveries: {wanted}, not int"),
    ]:
        with pytest.raises(sqlbroker.InvalidOption) as caught:
            op()
        assert str(caught.value) == said


@pytest.mark.parametrize("threads", [0, -1, True, 2.0, "4"], ids=repr)
def test_bad_async_broker_threads(tmp_path: Any, threads: object) -> None:
    with pytest.raises(sqlbroker.InvalidOption) as caught:
        sqlbroker.AsyncBroker(f"sqlite:///{tmp_path}/test.db", threads=threads)
    assert caught.value.field == "threads"


def test_a_manual_clock_refuses_a_naive_start() -> None:
    with pytest.raises(sqlbroker.InvalidTime) as caught:
        sqlbroker.ManualClock(datetime(2030, 1, 1))
    assert caught.value.field == "start"
    aware = datetime(2030, 1, 1).astimezone()
    assert sqlbroker.ManualClock(aware).now() == aware
