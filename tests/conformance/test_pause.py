"""Pause and resume (docs/flow-control.md) through the public API and the CLI, both
backends: a pause survives a restart, publishes still queue up, the two brokers agree
keyword for keyword, and the CLI's errors are one line with exit code 2."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from typing import Any

import pytest
from click.testing import CliRunner

import sqlbroker
from helpers import table_counts
from sqlbroker.interfaces.cli import cli


def test_a_pause_survives_a_restart_and_publishes_queue_up(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("orders", "order.*")
        broker.pause("orders", actor="ops", note="payment provider down")
    with sqlbroker.Broker(backend_url) as broker:
        message_id = broker.publish("order.placed", {"n": 1})
        assert broker.claim("orders", limit=10) == []
        (stats,) = broker.stats()
        assert (stats.subscription, stats.paused, stats.ready) == ("orders", True, 1)
        broker.resume("orders")
        assert [d.message_id for d in broker.claim("orders", limit=10)] == [message_id]
        assert [(e.actor, e.action) for e in broker.audit(limit=2)][1] == (
            "ops",
            "subscription.pause",
        )


def test_prometheus_shows_the_pause(broker: sqlbroker.Broker) -> None:
    pytest.importorskip("prometheus_client")
    from sqlbroker.interfaces.prometheus import exposition, registry_for

    broker.subscribe("orders", "order.*")
    broker.subscribe("emails", "user.*")
    broker.pause("orders")
    text = exposition(registry_for(broker)).decode()
    assert 'sqlbroker_subscription_paused{subscription="orders"} 1.0' in text
    assert 'sqlbroker_subscription_paused{subscription="emails"} 0.0' in text


def test_pausing_an_unknown_subscription_is_not_found(broker: sqlbroker.Broker) -> None:
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.NotFound):
        broker.pause("missing")
    assert table_counts(broker.backend) == before


def test_the_async_broker_pauses_the_same_way(backend_url: str) -> None:
    async def main() -> list[bool]:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            await broker.subscribe("orders", "order.*")
            await broker.pause("orders")
            paused = [s.paused for s in await broker.stats()]
            await broker.resume("orders")
            return paused + [s.paused for s in await broker.stats()]

    assert asyncio.run(main()) == [True, False]
    for name in ("pause", "resume"):
        sync = inspect.signature(getattr(sqlbroker.Broker, name))
        asynchronous = inspect.signature(getattr(sqlbroker.AsyncBroker, name))
        assert sync == asynchronous


def test_the_cli_pauses_resumes_and_cancels(backend_url: str) -> None:
    runner = CliRunner(env={"NO_COLOR": "1"})
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("orders", "order.*")
        message_id = broker.publish("order.placed", 1)

    def run(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(cli, ["--url", backend_url, *args])
        return result.exit_code, result.stdout, result.stderr

    assert run("pause", "orders", "--note", "deploy") == (0, "paused subscription orders\n", "")
    code, out, _ = run("stats")
    assert code == 0
    assert "orders (paused)" in out
    assert run("resume", "orders") == (0, "resumed subscription orders\n", "")
    assert run("cancel", message_id) == (
        0,
        f"cancelled 1 copy of message {message_id}\n",
        "",
    )
    for args, code_expected, message in [
        (("pause", "missing"), 1, "error: no subscription named 'missing'\n"),
        (("resume", "missing"), 1, "error: no subscription named 'missing'\n"),
        (("pause", "a b"), 2, None),
        (("cancel", "nope"), 2, None),
    ]:
        code, out, err = run(*args)
        assert (code, out) == (code_expected, "")
        assert err.startswith("error: ")
        assert err.count("\n") == 1
        if message is not None:
            assert err == message
    with sqlbroker.Broker(backend_url) as broker:
        actions = [(e.actor.split(":")[0], e.action) for e in broker.audit(limit=5)]
    assert actions == [
        ("cli", "message.cancel"),
        ("cli", "subscription.resume"),
        ("cli", "subscription.pause"),
    ]


def test_a_cancel_is_audited_with_the_copies_it_reached(broker: sqlbroker.Broker) -> None:
    broker.subscribe("orders", "order.*")
    broker.subscribe("emails", "order.*")
    message_id = broker.publish("order.placed", 1)
    (running,) = broker.claim("orders", limit=1)
    assert broker.cancel(message_id, actor="ops", note="sent twice") == 2
    assert broker.cancel(str(uuid.uuid4())) == 0  # reached nothing: nothing recorded
    (entry,) = [e for e in broker.audit(limit=10) if e.action == "message.cancel"]
    assert (entry.actor, entry.detail) == (
        "ops",
        {"message_ids": [message_id], "cancelled": 1, "flagged": 1, "note": "sent twice"},
    )
    assert running.message_id == message_id


def test_the_async_cancel_is_audited_as_the_api_user(backend_url: str) -> None:
    async def main() -> tuple[int, list[tuple[str, str]]]:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            await broker.subscribe("orders", "order.*")
            message_id = await broker.publish("order.placed", 1)
            count = await broker.cancel(message_id)
            audit = await broker.audit(limit=5)
            return count, [(e.actor.split(":")[0], e.action) for e in audit]

    assert asyncio.run(main()) == (1, [("api", "message.cancel")])


@pytest.mark.parametrize("options", [{"actor": ""}, {"actor": 7}, {"note": " "}])
def test_a_cancel_with_a_bad_actor_or_note_writes_nothing(
    broker: sqlbroker.Broker, options: dict[str, Any]
) -> None:
    broker.subscribe("orders", "order.*")
    message_id = broker.publish("order.placed", 1)
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.ValidationError):
        broker.cancel(message_id, **options)
    assert table_counts(broker.backend) == before
