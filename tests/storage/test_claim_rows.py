"""A claimed row decodes into a plain :class:`Delivery`: the fast path (rows._delivery_fast,
which builds it without the frozen dataclass's ``__init__``) gives what the constructor
gives, field by field, and the object behaves as any other ``Delivery``."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlbroker.core.message import Delivery
from sqlbroker.storage.rows import CLAIM_COLUMNS, deliveries_of, delivery_of

AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
MESSAGE_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
TOKEN = uuid.UUID("87654321-4321-8765-4321-876543218765")


def _row(**changes: Any) -> tuple[Any, ...]:
    values = {
        "id": 7,
        "message_id": MESSAGE_ID,
        "subscription": "jobs",
        "topic": "orders.created",
        "payload": b'{"n": 1}',
        "content_type": "application/json",
        "headers": '{"h": "v"}',
        "priority": 3,
        "ordering_key": "k",
        "idempotency_key": "i",
        "attempts": 2,
        "max_attempts": 5,
        "replay_count": 1,
        "enqueued_at": AT,
        "available_at": AT + timedelta(seconds=1),
        "expires_at": AT + timedelta(days=1),
        "lease_token": TOKEN,
        "lease_expires_at": AT + timedelta(seconds=30),
        **changes,
    }
    return tuple(values[name] for name in CLAIM_COLUMNS)


def _expected(**changes: Any) -> Delivery:
    fields = {
        "id": 7,
        "message_id": str(MESSAGE_ID),
        "subscription": "jobs",
        "topic": "orders.created",
        "payload": {"n": 1},
        "content_type": "application/json",
        "headers": {"h": "v"},
        "priority": 3,
        "key": "k",
        "idempotency_key": "i",
        "attempt": 2,
        "max_attempts": 5,
        "replay_count": 1,
        "enqueued_at": AT,
        "available_at": AT + timedelta(seconds=1),
        "expires_at": AT + timedelta(days=1),
        "lease_token": str(TOKEN),
        "lease_expires_at": AT + timedelta(seconds=30),
        **changes,
    }
    return Delivery(**fields)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (_row(), _expected()),
        (
            _row(expires_at=None, ordering_key=None, idempotency_key=None, headers=None),
            _expected(expires_at=None, key=None, idempotency_key=None, headers={}),
        ),
        (
            _row(payload=b"raw", content_type="text/plain", message_id="text-id"),
            _expected(payload=b"raw", content_type="text/plain", message_id="text-id"),
        ),
        # SQLite's times: Unix seconds (not the fast path's aware datetimes).
        (_row(enqueued_at=AT.timestamp()), _expected()),
    ],
)
def test_a_claimed_row_decodes_as_the_constructor_builds_it(
    row: tuple[Any, ...], expected: Delivery
) -> None:
    delivery = delivery_of(row)
    assert type(delivery) is Delivery
    for field in dataclasses.fields(Delivery):  # every slot set, to the same value
        assert getattr(delivery, field.name) == getattr(expected, field.name), field.name
    assert delivery == expected
    assert repr(delivery) == repr(expected)


def test_a_decoded_delivery_is_a_frozen_dataclass_like_any_other() -> None:
    delivery = delivery_of(_row(payload=b"[1, 2]"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        delivery.priority = 0  # type: ignore[misc]
    assert not hasattr(delivery, "__dict__")
    assert dataclasses.replace(delivery, priority=0).priority == 0
    assert dataclasses.asdict(delivery)["payload"] == [1, 2]
    assert copy.copy(delivery) == delivery
    assert pickle.loads(pickle.dumps(delivery)) == delivery


def test_a_row_that_does_not_decode_is_named_not_half_built() -> None:
    (sound,), damaged = deliveries_of([_row(priority="high", id=8), _row()])
    assert sound == _expected()
    assert [(d.id, d.problem) for d in damaged] == [(8, "priority is a str of 4, not an integer")]
