"""A queue batch (``send_many``) validates its shared options once and then only encodes
each payload: every message it builds must equal what ``build_message`` builds for that
payload with those options (its own id aside), and a bad payload is named by its index."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Any

import pytest

from sqlbroker.core import serde
from sqlbroker.core.errors import InvalidPayload, ValidationError
from sqlbroker.core.message import NewMessage, message_column, new_message_id, new_message_ids
from sqlbroker.features.publishing import PublishDefaults, build_batch, build_message

DEFAULTS = PublishDefaults(max_attempts=5, dedupe_window=60.0, payload_limit=1024)


class Level(IntEnum):
    HIGH = 1


PAYLOADS: list[Any] = [
    {"n": 1, "t": 1.5, "tags": ["a", None, True], "nested": {"x": (1, 2)}},
    [1, 2.0, "three"],
    "text",
    7,
    None,
    b"\x00raw bytes",
    {"level": Level.HIGH},  # a subclass: the full check accepts it, encoded as its base
    bytearray(b"more"),
]
OPTIONS: list[dict[str, Any]] = [
    {},
    {"priority": 7, "headers": {"h": "v"}, "max_attempts": 3, "ttl": 30, "delay": 5},
    {"at": datetime(2030, 1, 1, tzinfo=UTC), "expires_at": datetime(2031, 1, 1, tzinfo=UTC)},
    {"idempotency_key": "k", "dedupe_window": timedelta(seconds=9)},
    {"content_type": "text/plain"},
    {"content_type": "application/json"},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_each_message_of_a_queue_batch_is_what_build_message_makes(options: dict[str, Any]) -> None:
    payloads = PAYLOADS
    if options.get("content_type") == "text/plain":
        payloads = [p for p in PAYLOADS if isinstance(p, bytes | bytearray)]
    if options.get("content_type") == "application/json":
        payloads = [b'{"a": 1}', *(p for p in PAYLOADS if not isinstance(p, bytes | bytearray))]
    batch = build_batch(payloads, defaults=DEFAULTS, topic="jobs", options=options)
    assert len(batch) == len(payloads)
    assert len({m.message_id for m in batch}) == len(batch)
    for message, payload in zip(batch, payloads, strict=True):
        alone = build_message("jobs", payload, defaults=DEFAULTS, **options)
        assert dataclasses.replace(alone, message_id=message.message_id) == message
        assert uuid.UUID(message.message_id).version == 7


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (math.nan, "NaN"),
        ({"k": "a\x00b"}, "NUL"),
        ({1: "int key"}, "key of type int"),
        ("\ud800", "surrogate"),
        ({"big": "x" * 2000}, "limit"),
        ({"set": {1}}, "set"),
    ],
)
def test_a_bad_payload_of_a_queue_batch_is_named_by_its_index(bad: Any, problem: str) -> None:
    with pytest.raises(InvalidPayload, match=problem) as raised:
        build_batch([{"ok": 1}, {"ok": 2}, bad], defaults=DEFAULTS, topic="jobs")
    assert raised.value.field == "messages[2].payload"


@pytest.mark.parametrize("options", OPTIONS)
def test_a_queue_batch_reads_by_column_what_its_messages_hold(options: dict[str, Any]) -> None:
    # Storage reads a send_many batch column by column, without making its messages.
    payloads = [p for p in PAYLOADS if isinstance(p, bytes | bytearray)] if options else PAYLOADS
    if options.get("content_type") == "application/json":
        payloads = [b'{"a": 1}', b"[2]"]
    batch = build_batch(payloads, defaults=DEFAULTS, topic="jobs", options=options)
    messages = list(batch)
    assert [batch[i] for i in range(len(batch))] == messages == batch[:]
    assert batch[-1] == messages[-1]
    assert batch[1:][0] == messages[1]
    for field in NewMessage.__slots__:
        assert message_column(batch, field) == [getattr(m, field) for m in messages]
        assert message_column(messages, field) == message_column(batch, field)
    assert message_column(batch, "message_id") is not message_column(batch, "message_id")


def test_each_message_of_a_publish_batch_is_what_build_message_makes() -> None:
    # Items of only a topic and a payload take their topic's first such message as it is,
    # with their own payload and id; any other item is built alone.
    items: list[dict[str, Any]] = []
    for n, payload in enumerate(PAYLOADS * 2):
        items.append({"topic": "orders.created", "payload": payload})
        items.append({"topic": f"t{n % 3}", "payload": payload})
        items.append({"topic": "orders.created", "payload": payload, "priority": 7})
    batch = build_batch(items, defaults=DEFAULTS)
    assert len({m.message_id for m in batch}) == len(items)
    for message, item in zip(batch, items, strict=True):
        fields = {k: v for k, v in item.items() if k not in ("topic", "payload")}
        alone = build_message(item["topic"], item["payload"], defaults=DEFAULTS, **fields)
        assert dataclasses.replace(alone, message_id=message.message_id) == message
        assert uuid.UUID(message.message_id).version == 7


@pytest.mark.parametrize(
    ("bad", "field", "problem"),
    [
        ({"topic": "jobs", "payload": math.nan}, "messages[2].payload", "NaN"),
        ({"topic": "jobs", "payload": {"big": "x" * 2000}}, "messages[2].payload", "limit"),
        ({"topic": "jobs..x", "payload": 1}, "messages[2].topic", ""),
        ({"topic": ["jobs"], "payload": 1}, "messages[2].topic", ""),
        ({"topic": "jobs", "payload": 1, "nope": 1}, "messages[2]", "unknown"),
        ({"topic": "jobs"}, "messages[2]", "needs both"),
    ],
)
def test_a_bad_item_of_a_publish_batch_is_named_by_its_index(
    bad: dict[str, Any], field: str, problem: str
) -> None:
    items = [{"topic": "jobs", "payload": 1}, {"topic": "jobs", "payload": 2}, bad]
    with pytest.raises(ValidationError, match=problem or None) as raised:
        build_batch(items, defaults=DEFAULTS)
    assert raised.value.field == field


def test_message_ids_are_time_ordered_version_7_uuids() -> None:
    before = time.time_ns() // 1_000_000
    ids = [*new_message_ids(1000), *new_message_ids(1), *new_message_ids(3), new_message_id()]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for text in ids:
        value = uuid.UUID(text)
        assert str(value) == text
        assert (value.version, value.variant) == (7, uuid.RFC_4122)
        assert before <= value.int >> 80 <= after
    assert new_message_ids(0) == []


def test_the_ids_of_a_batch_ascend_in_its_order() -> None:
    # Copies published together get consecutive row ids: with ascending message ids too,
    # removing a run of them touches a page or two of each message_id index, not one each.
    batch = new_message_ids(1000)
    assert batch == sorted(batch)
    assert len({text[:15] for text in batch}) == 1  # one clock reading: the sort is in-ms


@pytest.mark.parametrize("value", [PAYLOADS[0], {"é": "\u2028", "f": -0.0, "n": 10**30}, "x", 1e16])
def test_the_encoding_is_the_same_without_the_c_encoder(
    value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = serde.encode_payload(value)
    monkeypatch.setattr(serde, "_c_encoder", None)
    assert serde.encode_payload(value) == fast
    assert fast[0] == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
