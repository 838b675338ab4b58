"""A single publish binds the same parameters as a batch's row: the ``_one`` insert's row
(spelled out for speed) and the batch's columns (built from ``_FIELDS``) agree."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sqlbroker.features.publishing import PublishDefaults, build_message
from sqlbroker.storage.operations.publishing import _columns, _row

DEFAULTS = PublishDefaults(max_attempts=5, dedupe_window=60.0, payload_limit=262_144)
AT = datetime(2030, 1, 2, tzinfo=UTC)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"delay": 3, "ttl": 9},
        {
            "key": "k",
            "priority": 0,
            "at": AT,
            "expires_at": AT.replace(year=2031),
            "max_attempts": 2,
            "headers": {"h": "v"},
            "idempotency_key": "i",
            "content_type": "text/plain",
        },
    ],
)
def test_a_single_row_is_the_batch_row_of_its_message(options: dict[str, object]) -> None:
    message = build_message("orders", b"body", defaults=DEFAULTS, **options)
    shared = {"subscription": "orders", "max_copies": 5}
    columns = {name: values[0] for name, values in _columns([message]).items()}
    row = _row(message, shared)
    assert row == {**columns, **shared}
    assert [type(row[name]) for name in ("delay", "ttl")] == [
        type(columns[name]) for name in ("delay", "ttl")
    ]
