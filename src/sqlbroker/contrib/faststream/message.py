"""The message a FastStream handler sees, and how its ack, nack and reject settle the
sqlbroker copy underneath.

The raw message of every subscriber is a :class:`sqlbroker.Message` delivered by a worker
in ``ack="manual"`` mode, so each FastStream outcome becomes exactly one sqlbroker
settlement:

- ``ack()`` completes the copy (archived ``completed``);
- ``nack(delay=None)`` asks the subscriber's :class:`~sqlbroker.RetryPolicy`: a retry after
  its backoff (or ``delay`` seconds), or a dead letter once the attempts are spent or the
  error is one the policy dead-letters at once;
- ``reject(reason=None)`` dead-letters the copy now, with ``reason`` or the handler's error.

FastStream calls these itself by the subscriber's ``AckPolicy`` (see the broker); a handler
may call them too, or raise ``AckMessage``/``NackMessage``/``RejectMessage``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import BaseMiddleware, StreamMessage
from faststream.message import decode_message

from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.serde import BYTES_CONTENT_TYPE, JSON_CONTENT_TYPE
from sqlbroker.runtime import Message

CORRELATION_HEADER = "correlation_id"
REPLY_TO_HEADER = "reply_to"


_ENCODE_LATER: Any = object()


class SqlMessage(StreamMessage[Message]):
    """A FastStream message over one sqlbroker delivery (``raw_message``)."""

    def __init__(self, *args: Any, retry: RetryPolicy, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry = retry
        self.error: BaseException | None = None
        """The handler's exception, when it raised one (set by :class:`ErrorCapture`)."""

    _body: Any

    @property
    def body(self) -> bytes:
        """The payload as bytes. A JSON payload arrives decoded and goes to the handler as
        it is (see :func:`decode`), so its bytes are only made here, if someone asks."""
        if self._body is _ENCODE_LATER:
            payload = self.raw_message.payload
            self._body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        body: bytes = self._body
        return body

    @body.setter
    def body(self, value: Any) -> None:
        self._body = value

    @property
    def attempt(self) -> int:
        """1 on the first delivery, 2 on the first retry, …"""
        return self.raw_message.attempt

    def _open(self) -> bool:
        """Not settled yet: neither through this message nor through the sqlbroker
        message itself (``raw_message.transaction()`` completes it when it commits)."""
        return self.committed is None and not self.raw_message.settled

    async def ack(self) -> None:
        """Complete the message."""
        if self._open():
            self.raw_message.ack()
        await super().ack()

    async def nack(self, *, delay: float | None = None) -> None:
        """Try again: after ``delay`` seconds, or the retry policy's backoff; dead-letter
        instead when the policy says so (attempts spent, or a ``dead_on`` error)."""
        if self._open():
            raw = self.raw_message
            error = self.error or _Nacked("nacked by the handler")
            settlement = self.retry.decide(raw.delivery, error)
            if settlement.kind == "dead":
                raw.reject(_dead_reason(settlement.reason, self.error), error=self.error)
            else:
                raw.nack(after=settlement.after if delay is None else delay, error=self.error)
        await super().nack()

    async def reject(self, *, reason: str | None = None) -> None:
        """Dead-letter the message now."""
        if self._open():
            self.raw_message.reject(reason or _describe(self.error), error=self.error)
        await super().reject()


class _Nacked(Exception):
    """A nack without an exception behind it (``await msg.nack()``, ``NackMessage``)."""


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "rejected by the handler"
    if _invalid_fields(error) is not None:
        return _dead_reason(f"rejected: {type(error).__name__}", error)
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}"[:500] if first else type(error).__name__


def _dead_reason(reason: str, error: BaseException | None) -> str:
    """The policy's reason, with the fields at fault when validation refused the payload."""
    details = _invalid_fields(error)
    if details is None:
        return reason
    return f"invalid payload ({reason}): {'; '.join(details)}"[:1000]


def _invalid_fields(error: BaseException | None) -> list[str] | None:
    """``field: problem`` for each field a validation error (pydantic's) names."""
    problems = getattr(error, "errors", None)
    if not callable(problems):
        return None
    try:
        return [
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in problems()
        ]
    except Exception:
        return None


class ErrorCapture(BaseMiddleware):
    """Keeps the handler's exception on the :class:`SqlMessage`, so that the ack policy's
    nack or reject (which FastStream calls without arguments) can give the retry policy and
    the dead letter the real error and reason."""

    async def consume_scope(
        self, call_next: Callable[[Any], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        try:
            return await call_next(msg)
        except Exception as error:
            if isinstance(msg, SqlMessage):
                msg.error = error
            raise


def make_parser(retry: RetryPolicy) -> Callable[[Message], Awaitable[SqlMessage]]:
    """The parser of a subscriber whose failures the ``retry`` policy decides."""

    async def parse(raw: Message) -> SqlMessage:
        payload = raw.payload
        body = (
            bytes(payload) if isinstance(payload, bytes | bytearray | memoryview) else _ENCODE_LATER
        )
        headers = dict(raw.headers)
        content_type: str | None = raw.content_type
        if content_type == BYTES_CONTENT_TYPE:
            # Published without a content type: FastStream then guesses (JSON, else bytes).
            content_type = None
        return SqlMessage(
            raw,
            body,
            headers=headers,
            reply_to=headers.get(REPLY_TO_HEADER, ""),
            content_type=content_type,
            correlation_id=headers.get(CORRELATION_HEADER) or raw.id,
            message_id=raw.id,
            retry=retry,
        )

    return parse


async def decode(msg: StreamMessage[Any]) -> Any:
    """A JSON payload comes out of the database already decoded: hand it over as it is."""
    raw = msg.raw_message
    if (
        isinstance(msg, SqlMessage)
        and msg._body is _ENCODE_LATER
        and isinstance(raw, Message)
        and msg.content_type == JSON_CONTENT_TYPE
    ):
        return raw.payload
    return decode_message(msg)
