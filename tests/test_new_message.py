"""A publish's message is made as a draft filled in field by field (without the frozen
dataclass's ``__init__``): it is the ``NewMessage`` the constructor makes, field by field,
and behaves as any other (type, equality, repr, frozenness, replace, copy, pickle)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from datetime import UTC, datetime
from typing import Any

import pytest

from sqlbroker.core.message import NewMessage, finish_message, new_message_draft
from sqlbroker.features.publishing import PublishDefaults, build_message

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
REQUIRED: dict[str, Any] = {
    "message_id": "0190-id",
    "topic": "orders.created",
    "payload": b'{"n":1}',
    "content_type": "application/json",
    "headers": '{"h":"v"}',
    "priority": 3,
    "ordering_key": "k",
    "idempotency_key": "i",
    "payload_hash": "hash",
    "delay": 1.5,
    "available_at": AT,
    "ttl": 60.0,
    "expires_at": AT,
    "max_attempts": 4,
    "dedupe_window": 30.0,
}
# Each field a value of its own, so that two fields swapped would show.
DISTINCT = {name: f"value of {name}" for name in NewMessage.__slots__}


def _made(values: dict[str, Any]) -> NewMessage:
    draft = new_message_draft()
    for name, value in values.items():
        setattr(draft, name, value)
    return finish_message(draft)


DEFAULTS = {f.name: f.default for f in dataclasses.fields(NewMessage) if f.name not in REQUIRED}


def test_a_draft_takes_the_fields_of_new_message_and_nothing_else() -> None:
    with pytest.raises(AttributeError):
        new_message_draft().topics = "orders.created"
    with pytest.raises(AttributeError):  # a field left unset is not read as anything
        _made(REQUIRED).replace  # noqa: B018


@pytest.mark.parametrize(
    "values",
    [
        {**REQUIRED, **DEFAULTS},
        {**REQUIRED, "replace": True, "debounce": 2.0, "debounce_max": 9.0},
        DISTINCT,
    ],
)
def test_it_makes_what_the_constructor_makes(values: dict[str, Any]) -> None:
    made, expected = _made(values), NewMessage(**values)
    assert type(made) is NewMessage
    for field in dataclasses.fields(NewMessage):  # every slot set, to its own value
        assert getattr(made, field.name) == getattr(expected, field.name), field.name
    assert made == expected
    assert repr(made) == repr(expected)
    assert hash(made) == hash(expected)


def test_a_made_message_is_a_frozen_dataclass_like_any_other() -> None:
    message = _made({**REQUIRED, **DEFAULTS})
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.priority = 0  # type: ignore[misc]
    assert not hasattr(message, "__dict__")
    assert dataclasses.replace(message, priority=0) == NewMessage(**{**REQUIRED, "priority": 0})
    assert dataclasses.asdict(message)["topic"] == "orders.created"
    assert copy.copy(message) == message
    assert pickle.loads(pickle.dumps(message)) == message


def test_a_built_publish_is_a_new_message() -> None:
    defaults = PublishDefaults(max_attempts=5, dedupe_window=60.0, payload_limit=1024)
    message = build_message("orders.created", {"n": 1}, defaults=defaults, key="k", ttl=9)
    assert type(message) is NewMessage
    assert message == NewMessage(
        message_id=message.message_id,
        topic="orders.created",
        payload=b'{"n":1}',
        content_type="application/json",
        headers=None,
        priority=2,
        ordering_key="k",
        idempotency_key=None,
        payload_hash=None,
        delay=None,
        available_at=None,
        ttl=9.0,
        expires_at=None,
        max_attempts=5,
        dedupe_window=60.0,
    )
