"""Publishing: FastStream's publish commands written as sqlbroker messages."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from faststream.exceptions import FeatureNotSupportedException, IncorrectState
from faststream.response import PublishCommand, PublishType

from sqlbroker import RetryPolicy
from sqlbroker.core.serde import BYTES_CONTENT_TYPE
from sqlbroker.storage.caller import CallerConnection

from .message import CORRELATION_HEADER, REPLY_TO_HEADER, decode, make_parser

if TYPE_CHECKING:
    from fast_depends.library.serializer import SerializerProto
    from faststream._internal.basic_types import SendableMessage
    from faststream._internal.parser import CodecProto
    from faststream._internal.types import AsyncCallable

    from .connection import SqlConnection

PUBLISH_OPTIONS = (
    "key",
    "replace",
    "debounce",
    "debounce_max",
    "priority",
    "delay",
    "at",
    "ttl",
    "expires_at",
    "max_attempts",
    "idempotency_key",
    "dedupe_window",
)
"""sqlbroker publish options a FastStream publish passes through (None: the default)."""


def publish_options(values: dict[str, Any]) -> dict[str, Any]:
    """The sqlbroker publish options set in a signature's ``locals()`` (None: the default)."""
    return {name: values[name] for name in PUBLISH_OPTIONS if values.get(name) is not None}


class SqlPublishCommand(PublishCommand):
    """A publish to a sqlbroker topic, with sqlbroker's options and an optional caller
    connection (``conn``) whose open transaction the publish joins."""

    def __init__(
        self,
        message: SendableMessage,
        *,
        topic: str = "",
        correlation_id: str | None = None,
        headers: dict[str, Any] | None = None,
        reply_to: str = "",
        conn: CallerConnection | None = None,
        options: dict[str, Any] | None = None,
        extra_bodies: tuple[SendableMessage, ...] = (),
        _publish_type: PublishType = PublishType.PUBLISH,
    ) -> None:
        super().__init__(
            body=message,
            destination=topic,
            correlation_id=correlation_id,
            headers=headers,
            reply_to=reply_to,
            _publish_type=_publish_type,
        )
        self.conn = conn
        self.options = {k: v for k, v in (options or {}).items() if v is not None}
        self.extra_bodies = extra_bodies

    @property
    def batch_bodies(self) -> tuple[Any, ...]:
        return (self.body, *self.extra_bodies)

    def single(self, body: SendableMessage) -> SqlPublishCommand:
        """This command for one of its batch's bodies."""
        one = copy.copy(self)
        one.body, one.extra_bodies = body, ()
        return one

    @classmethod
    def from_cmd(cls, cmd: PublishCommand) -> SqlPublishCommand:
        if isinstance(cmd, SqlPublishCommand):
            return cmd
        return cls(
            cmd.body,
            topic=cmd.destination,
            correlation_id=cmd.correlation_id,
            headers=cmd.headers,
            reply_to=cmd.reply_to,
            _publish_type=cmd.publish_type,
        )


async def encode_command(
    cmd: SqlPublishCommand,
    codec: CodecProto,
    serializer: SerializerProto | None,
    body: Any = None,
) -> dict[str, Any]:
    """The sqlbroker message a command publishes (for ``body``, one of a batch's, when
    given): its topic, payload bytes, content type and headers."""
    payload, content_type = await codec.encode(cmd.body if body is None else body, serializer)
    headers = dict(cmd.headers)
    if cmd.correlation_id:
        headers[CORRELATION_HEADER] = cmd.correlation_id
    if cmd.reply_to:
        headers[REPLY_TO_HEADER] = cmd.reply_to
    return {
        "topic": cmd.destination,
        "payload": payload,
        "content_type": content_type or BYTES_CONTENT_TYPE,
        "headers": headers or None,
    }


class SqlProducer:
    """FastStream's producer for sqlbroker: each publish is one committed message (or one
    row in the caller's transaction, with ``conn=``)."""

    _parser: AsyncCallable
    _decoder: AsyncCallable

    def __init__(self, codec: CodecProto) -> None:
        self._parser = make_parser(RetryPolicy())
        self._decoder = decode
        self.codec = codec
        self.serializer: SerializerProto | None = None
        self._connection: SqlConnection | None = None

    def connect(self, connection: SqlConnection, serializer: SerializerProto | None) -> None:
        self._connection = connection
        self.serializer = serializer

    def disconnect(self) -> None:
        self._connection = None

    @property
    def connection(self) -> SqlConnection:
        if self._connection is None:
            raise IncorrectState("SqlBroker is not connected: call connect() or start() first")
        return self._connection

    async def publish(self, cmd: SqlPublishCommand) -> str:
        connection = self.connection
        cmd = SqlPublishCommand.from_cmd(cmd)
        message = await encode_command(cmd, self.codec, self.serializer)
        message_id = await connection.publisher.publish(**message, conn=cmd.conn, **cmd.options)
        if cmd.conn is None:
            connection.hint()
        return message_id

    async def request(self, cmd: SqlPublishCommand) -> Any:
        raise FeatureNotSupportedException(
            "SqlBroker does not support request/reply (RPC); publish with reply_to= and "
            "subscribe to the reply topic instead"
        )

    async def publish_batch(self, cmd: SqlPublishCommand) -> list[str]:
        """All the batch's messages in one transaction (the caller's, with ``conn=``)."""
        connection = self.connection
        cmd = SqlPublishCommand.from_cmd(cmd)
        items = [
            {**await encode_command(cmd, self.codec, self.serializer, body), **cmd.options}
            for body in cmd.batch_bodies
        ]
        message_ids = await connection.publisher.publish_many(items, conn=cmd.conn)
        if cmd.conn is None:
            connection.hint()
        return message_ids
