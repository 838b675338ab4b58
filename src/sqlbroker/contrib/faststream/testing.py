"""``TestSqlBroker``: FastStream's in-memory test client for SqlBroker.

.. code-block:: python

    async with TestSqlBroker(broker) as br:
        await br.publish({"id": 1}, "orders")
        handle.mock.assert_called_once_with({"id": 1})

Messages go straight to the matching subscribers' handlers, through the same parser,
decoder, dependency injection, validation and ack policy as in production, without a
database (``with_real=True`` uses the real one). A handler's exception reaches the caller of
``publish``, as with FastStream's other test brokers; the settlement each message got is
recorded on its raw message (``msg.raw_message``: see :class:`RecordedOutcome`).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from unittest.mock import MagicMock

from faststream._internal.parser import DefaultCodec
from faststream._internal.testing.broker import TestBroker, change_producer
from faststream.exceptions import SubscriberNotFound

from sqlbroker import Delivery, Message
from sqlbroker.core.settlements import Settlement
from sqlbroker.core.topics import pattern_matches

from .broker import SqlBroker
from .producer import SqlProducer, SqlPublishCommand, encode_command
from .publisher import SqlPublisher
from .subscriber import SqlSubscriber

__all__ = ["TestSqlBroker"]

_ids = itertools.count(1)


class TestSqlBroker(TestBroker[SqlBroker], broker=SqlBroker):
    """Runs a :class:`SqlBroker`'s handlers in memory for tests (FastStream's TestClient)."""

    def create_publisher_fake_subscriber(
        self, broker: SqlBroker, publisher: SqlPublisher
    ) -> tuple[SqlSubscriber, bool]:
        for candidate in broker.subscribers:
            if isinstance(candidate, SqlSubscriber) and _matches(candidate, publisher.topic):
                return candidate, True
        sub = broker.subscriber(publisher.topic, persistent=False)
        return sub, False

    @contextmanager
    def _patch_producer(self, broker: SqlBroker) -> Iterator[None]:
        with change_producer(broker.config.broker_config, FakeProducer(broker)):
            yield

    async def _fake_connect(self, broker: SqlBroker, *args: Any, **kwargs: Any) -> Any:
        return MagicMock()


def _matches(sub: SqlSubscriber, topic: str) -> bool:
    return any(pattern_matches(pattern, topic) for pattern in sub.topics)


class FakeProducer(SqlProducer):
    """Delivers each publish to one handler per matching subscription, in memory."""

    def __init__(self, broker: SqlBroker) -> None:
        super().__init__(broker.config.broker_codec or DefaultCodec())
        self.broker = broker
        self.serializer = broker.config.fd_config._serializer

    async def publish(self, cmd: SqlPublishCommand) -> str:
        cmd = SqlPublishCommand.from_cmd(cmd)
        message = await encode_command(cmd, self.codec, self.serializer)
        message_id = str(uuid.uuid4())
        delivered: set[str] = set()
        for sub in self.broker.subscribers:
            if not isinstance(sub, SqlSubscriber) or sub.name in delivered:
                continue
            if not _matches(sub, cmd.destination):
                continue
            delivered.add(sub.name)
            raw = fake_message(message_id, sub.name, **message)
            await sub.process_message(raw)
        if not delivered and cmd.destination and cmd.publish_type.value == "reply":
            raise SubscriberNotFound(f"no subscriber for the reply topic {cmd.destination!r}")
        return message_id

    async def publish_batch(self, cmd: SqlPublishCommand) -> list[str]:
        cmd = SqlPublishCommand.from_cmd(cmd)
        return [await self.publish(cmd.single(body)) for body in cmd.batch_bodies]


class RecordedOutcome:
    """The settlement a test message got: ``kind`` is ``complete``, ``retry`` or
    ``dead``; ``outcome`` is sqlbroker's own record of it (a ``Settlement``)."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.outcome: Settlement | None = None

    def __call__(self, outcome: Settlement) -> None:
        self.outcome = outcome
        self.kind = outcome.kind


def fake_message(
    message_id: str,
    subscription: str,
    topic: str,
    payload: bytes,
    content_type: str,
    headers: dict[str, Any] | None,
) -> Message:
    """A sqlbroker message as a worker would deliver it (first attempt), settled into a
    :class:`RecordedOutcome` (its ``settled_with`` attribute)."""
    now = datetime.now(UTC)
    value: Any = payload
    if content_type == "application/json":
        import json

        value = json.loads(payload)
    delivery = Delivery(
        id=next(_ids),
        message_id=message_id,
        subscription=subscription,
        topic=topic,
        payload=value,
        content_type=content_type,
        headers=dict(headers or {}),
        priority=2,
        key=None,
        idempotency_key=None,
        attempt=1,
        max_attempts=5,
        replay_count=0,
        enqueued_at=now,
        available_at=now,
        expires_at=None,
        lease_token=uuid.uuid4().hex,
        lease_expires_at=now,
    )
    return Message(delivery, RecordedOutcome())
