"""The message a handler receives. How it ends is a
:class:`~sqlbroker.core.settlements.Settlement` (its ``delivery`` kept for the pump's
hooks and lease bookkeeping), the one type every settling path writes."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlbroker.core import validate
from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.message import Delivery, ErrorInfo
from sqlbroker.core.policies import DEFAULT_RETRY
from sqlbroker.core.serde import DEFAULT_PAYLOAD_LIMIT, encode_value
from sqlbroker.core.settlements import Settlement

if TYPE_CHECKING:
    from sqlbroker.runtime.effects import EffectsTransaction


T = TypeVar("T")

_OPEN, _COMMITTING, _SETTLED = 0, 1, 2
"""A message's settlement: none yet; its transaction entered, whose commit settles it;
settled (or handed to the pump, which settles it)."""


class AlreadySettled(SqlbrokerError):
    """``ack``, ``nack`` or ``reject`` was called on a message that was already settled."""


class Message:
    """A message as a handler sees it.

    With the default ``ack="auto"`` the pump settles the message from the handler's result:
    returning completes it, raising retries or dead-letters it by the retry policy. With
    ``ack="manual"`` the handler (or whatever it hands the message to) calls exactly one of
    :meth:`ack`, :meth:`nack` or :meth:`reject`; until then the pump keeps the lease alive.
    """

    __slots__ = (
        "_cancel",
        "_delivery",
        "_effects",
        "_lock",
        "_result_limit",
        "_settle",
        "_state",
        "_threads",
    )

    def __init__(
        self,
        delivery: Delivery,
        settle: Callable[[Settlement], None] | None = None,
        effects: Callable[[Message], EffectsTransaction] | None = None,
        threads: Executor | None = None,
        result_limit: int = DEFAULT_PAYLOAD_LIMIT,
    ) -> None:
        self._delivery = delivery
        self._result_limit = result_limit
        self._settle = settle
        self._effects = effects
        self._threads = threads
        # The handler's thread (or any thread it hands the message to) and the pump's
        # loop both move the state: each move is one check-and-set under this lock.
        self._lock = threading.Lock()
        self._state = _OPEN
        self._cancel: threading.Event | None = None  # made on first use: most never are

    def __repr__(self) -> str:
        return (
            f"Message(id={self.id!r}, topic={self.topic!r}, subscription={self.subscription!r},"
            f" attempt={self.attempt})"
        )

    @property
    def delivery(self) -> Delivery:
        """The claimed copy itself (:class:`~sqlbroker.Delivery`), with its lease."""
        return self._delivery

    @property
    def id(self) -> str:
        """The message id (the same for every subscription's copy)."""
        return self._delivery.message_id

    @property
    def delivery_id(self) -> int:
        """This subscription's copy."""
        return self._delivery.id

    @property
    def subscription(self) -> str:
        """The subscription (queue) this copy was delivered to."""
        return self._delivery.subscription

    @property
    def topic(self) -> str:
        """The topic the message was published to."""
        return self._delivery.topic

    @property
    def payload(self) -> Any:
        """The decoded payload."""
        return self._delivery.payload

    @property
    def content_type(self) -> str:
        """The payload's content type (``application/json`` unless published otherwise)."""
        return self._delivery.content_type

    @property
    def headers(self) -> dict[str, str]:
        """The message's headers (text to text)."""
        return self._delivery.headers

    @property
    def key(self) -> str | None:
        """The ordering key, or ``None``: copies of one key are handled one at a time, in order."""
        return self._delivery.key

    @property
    def priority(self) -> int:
        """The priority, 0 (``URGENT``, claimed first) to 9."""
        return self._delivery.priority

    @property
    def attempt(self) -> int:
        """1 on the first delivery, 2 on the first retry, …"""
        return self._delivery.attempt

    @property
    def max_attempts(self) -> int:
        """The claims allowed before the copy is dead-lettered."""
        return self._delivery.max_attempts

    @property
    def replay_count(self) -> int:
        """How many times the copy was replayed from the dead letters."""
        return self._delivery.replay_count

    @property
    def enqueued_at(self) -> datetime:
        """When the message was published (the database's clock)."""
        return self._delivery.enqueued_at

    @property
    def cancelled(self) -> bool:
        """Whether the message was cancelled while this handler runs (``Broker.cancel``).
        A coroutine handler is cancelled outright; a plain function should check this (or
        wait on :attr:`cancel_event`) and return early. Either way the copy is archived as
        cancelled, also if the handler finishes its work."""
        event = self._cancel
        return event is not None and event.is_set()

    @property
    def cancel_event(self) -> threading.Event:
        """Set when the message is cancelled: ``msg.cancel_event.wait(5)`` sleeps 5 s
        unless a cancel comes first."""
        with self._lock:
            if self._cancel is None:
                self._cancel = threading.Event()
            return self._cancel

    @property
    def settled(self) -> bool:
        """Whether the outcome is decided: ``ack``, ``nack`` or ``reject`` was called, or
        :meth:`transaction` was entered (its commit completes the message)."""
        return self._state != _OPEN

    def transaction(self) -> EffectsTransaction:
        """A transaction on the broker's database in which the message is acknowledged:

        .. code-block:: python

            with msg.transaction() as conn:          # async with … in a coroutine
                conn.execute("INSERT INTO ledger …", …)

        ``conn`` is the driver connection (``sqlite3.Connection``, ``psycopg.Connection``,
        or ``psycopg.AsyncConnection`` under ``async with``). When the block ends normally
        the message is completed in the same transaction, which then commits: the writes
        and the ack happen together or not at all. An exception in the block rolls both
        back and the retry policy decides as usual; a lease lost meanwhile rolls back and
        raises ``LeaseLost``. Write only through ``conn`` inside the block (on SQLite a
        second connection's write would wait for this transaction to end).
        """
        if self._effects is None:
            raise SqlbrokerError("msg.transaction() is for messages a worker delivered")
        return self._effects(self)

    async def _off_loop(self, fn: Callable[..., T], /, *args: Any) -> T:
        """Run blocking work that belongs to this message's handling (a saga step's
        bookkeeping around a coroutine step, a plain ``on_dead_letter`` hook) on the
        worker's handler threads, in the caller's context: asyncio's default executor is
        user code's, and far smaller than a subscriber's concurrency may be. Outside a
        worker it is that default executor."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await loop.run_in_executor(self._threads, call)

    def _move(self, allowed: tuple[int, ...], to: int) -> bool:
        """Move the state to ``to`` if it is one of ``allowed``: ``True`` then."""
        with self._lock:
            if self._state not in allowed:
                return False
            self._state = to
            return True

    def _begin_settling(self) -> None:
        """The message's transaction is entered."""
        if not self._move((_OPEN,), _COMMITTING):
            raise AlreadySettled(f"message {self.id} was already settled")

    def _abort_settling(self) -> None:
        """The message's transaction rolled back (unless the pump took the message over)."""
        self._move((_COMMITTING,), _OPEN)

    def _end_settling(self) -> None:
        """The message's transaction committed: the message is completed."""
        self._move((_OPEN, _COMMITTING, _SETTLED), _SETTLED)

    def _take_over(self, *, uncommitted: bool) -> bool:
        """For the pump, when the handler ended: ``True`` if the pump must write the
        outcome itself, which settles the message. That is when nothing settled it — and,
        with ``uncommitted``, also when its transaction has not committed yet: the thread
        running it was given up (a timeout, a stop at once) and may never finish. Should
        that commit still come, the lease token lets exactly one of the two writes win."""
        return self._move((_OPEN, _COMMITTING) if uncommitted else (_OPEN,), _SETTLED)

    def _finish(self, settlement: Settlement) -> None:
        if self._settle is None:
            raise SqlbrokerError("ack/nack/reject are for subscribers with ack='manual'")
        if not self._move((_OPEN,), _SETTLED):
            raise AlreadySettled(f"message {self.id} was already settled")
        if self.cancelled:
            settlement = Settlement.cancel(self._delivery)
        try:
            self._settle(settlement)
        except BaseException:
            # Not taken (the worker has stopped): the message is not settled.
            self._move((_SETTLED,), _OPEN)
            raise

    def ack(self, result: Any = None) -> None:
        """Complete the message; ``result`` is stored as its result (docs/results.md), as a
        handler's return value is (``InvalidPayload`` if it cannot be, and the message
        stays unsettled)."""
        value = (
            None
            if result is None
            else encode_value(result, limit=self._result_limit, field="result")
        )
        self._finish(Settlement.complete(self._delivery, value))

    def nack(
        self, *, after: float | timedelta = 0.0, error: BaseException | str | None = None
    ) -> None:
        """Try the message again after ``after`` seconds (the attempt counts). When its
        attempts are spent (the retry policy's rule) it is dead-lettered instead, with
        reason ``max attempts exhausted``, as a handler's exception would be."""
        delay = validate.seconds(after, "after")
        # The claim stored the subscriber's limit in the copy: the default policy applies it.
        settlement = DEFAULT_RETRY.decide_retry(
            self._delivery, after=delay, error=ErrorInfo.coerce(error)
        )
        self._finish(settlement)

    def reject(self, reason: str, *, error: BaseException | str | None = None) -> None:
        """Dead-letter the message now."""
        info = ErrorInfo.coerce(error)
        self._finish(Settlement.dead(self._delivery, validate.reason(reason), info))
