"""Bytes labelled ``application/json``: checked like a JSON value at publish, and a stored
JSON payload that does not parse (raw SQL, an older version) is delivered as its raw bytes
instead of breaking the claim, the dead-letter listing or the archive."""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlbroker
from helpers import claim_one

JSON = "application/json"


def _raw(backend_url: str) -> Any:
    if backend_url.startswith("sqlite"):
        return sqlite3.connect(backend_url.removeprefix("sqlite:///"), isolation_level=None)
    import psycopg

    return psycopg.connect(backend_url, autocommit=True)


def _corrupt(backend_url: str, message_id: str, payload: bytes) -> None:
    """Overwrite a stored payload behind the broker's back, as raw SQL could."""
    mark = "?" if backend_url.startswith("sqlite") else "%s"
    conn = _raw(backend_url)
    try:
        updated = conn.execute(
            f"UPDATE sqlbroker_message SET payload = {mark} WHERE message_id = {mark}",
            (payload, message_id),
        ).rowcount
    finally:
        conn.close()
    assert updated == 1


def test_json_bytes_are_stored_as_given_and_delivered_parsed(broker: sqlbroker.Broker) -> None:
    document = b' {"a": [1, 2.5, "\\u00e9"], "b": null} '
    broker.send("q", document, content_type=JSON)
    delivery = claim_one(broker, "q")
    assert delivery.payload == {"a": [1, 2.5, "é"], "b": None}
    assert delivery.content_type == JSON


def test_a_stored_json_payload_that_does_not_parse_is_delivered_as_bytes(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    broken = b'{"half": '
    bad = broker.send("q", {"fine": 1})
    good = broker.send("q", {"fine": 2})
    broker.stats()
    _corrupt(backend_url, bad, broken)

    first, second = broker.claim("q", limit=10)  # one bad row does not poison the batch
    assert (first.message_id, first.payload, first.content_type) == (bad, broken, JSON)
    assert (second.message_id, second.payload) == (good, {"fine": 2})
    broker.complete(second)

    broker.dead_letter(first, reason="unreadable")
    (dead,) = broker.dead_letters.list()
    assert (dead.payload, dead.content_type) == (broken, JSON)
    assert broker.dead_letters.get(dead.id).payload == broken

    broker.dead_letters.replay([dead.id])
    again = claim_one(broker, "q")
    assert again.payload == broken
    broker.complete(again)
    archived = {a.message_id: a.payload for a in broker.archive("q")}
    assert archived == {bad: broken, good: {"fine": 2}}


def test_a_stored_json_payload_that_is_not_utf8_is_delivered_as_bytes(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    message_id = broker.send("q", "x")
    broker.stats()
    _corrupt(backend_url, message_id, b'"\xff"')
    assert claim_one(broker, "q").payload == b'"\xff"'
