"""Processed keys: consumer-side idempotency for effects outside the database.

Delivery is at-least-once, so a handler that charges a card or sends an email may run
twice for one message. ``broker.once(scope, key)`` records, per business key, that the
effect was carried out, and skips it on every later delivery within the window:

.. code-block:: python

    with broker.once("charge", msg.payload["order_id"]) as first:
        if first:
            payments.charge(msg.payload["order_id"], msg.payload["amount"])

It works in two phases, so that a consumer dying half-way neither loses the effect nor
blocks it forever:

1. **reserve** — the key is taken for ``lease`` seconds under a fresh token. A key done
   within its window makes ``first`` false; a key another consumer holds right now raises
   :class:`KeyInProgress` (a :class:`~sqlbroker.Retry`: the runtime snoozes the message
   without using up an attempt), and a holder whose lease ran out — it died — loses the key
   to the next comer;
2. **confirm** — when the block ends normally the key becomes *done* and stays so for
   ``window`` seconds (default: the broker's ``dedupe_window``, 24 h); an exception in the
   block releases the reservation, so the retry runs the effect again.

What it cannot do: make an external effect and the confirmation atomic. A crash after
the effect and before the confirmation (a few milliseconds) runs the effect again once
the lease expires; pass the key on to the external system as its idempotency key too
where it takes one (most payment APIs do). A block that outlives ``lease`` may be taken
over: call ``extend()`` on long effects; the confirmation then raises
``ReservationLost``. Effects
in the broker's own database need none of this: use ``msg.transaction()``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import TracebackType

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidName, InvalidOption, ReservationLost
from sqlbroker.core.policies import Retry
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.faces import Awaiting, Blocking, Face, Part, Plan, call, operation

DEFAULT_KEY_LEASE = 60.0


class KeyInProgress(Retry):
    """Another consumer holds the processed key right now; try again later."""

    def __init__(self, scope: str, key: str, after: float) -> None:
        self.scope = scope
        self.key = key
        super().__init__(after, f"processed key {scope}/{key} is held by another consumer")


class OnceBase(Part):
    """A processed key's reservation (:meth:`Broker.once` makes it); the faces enter it."""

    def __init__(
        self, broker: Face, scope: str, key: str | int, *, lease: object, window: object
    ) -> None:
        """Validate everything before any SQL runs (``window=None``: the broker's
        ``dedupe_window``)."""
        super().__init__(broker)
        validate_topic(scope, "scope")
        self.scope = scope
        self.key = processed_key(key)
        self._lease = DEFAULT_KEY_LEASE if lease is None else validate.lease_seconds(lease)
        self._window = validate.seconds(window, "window", allow_zero=False)
        self._token: str | None = None
        self._entered = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scope!r}, {self.key!r})"

    def _enter_plan(self) -> Plan[bool]:
        if self._entered:
            raise InvalidOption("once", "enter each once() a single time")
        self._entered = True
        token = str(uuid.uuid4())
        status = yield call(
            "processed_reserve",
            scope=self.scope,
            key=self.key,
            token=token,
            lease=self._lease,
            window=self._window,
        )
        if status == "busy":
            raise KeyInProgress(self.scope, self.key, after=min(self._lease, 5.0))
        if status == "done":
            return False
        self._token = token
        return True

    def _exit_plan(self, failed: bool) -> Plan[None]:
        token, self._token = self._token, None
        if token is None:
            return
        if failed:
            yield call("processed_release", scope=self.scope, key=self.key, token=token)
            return
        confirmed = yield call(
            "processed_confirm", scope=self.scope, key=self.key, token=token, window=self._window
        )
        if not confirmed:
            raise ReservationLost(self.scope, self.key)

    _enter = operation(_enter_plan)
    _exit = operation(_exit_plan)

    @operation
    def extend(self, lease: float | timedelta | None = None) -> Plan[None]:
        """Keep the reservation for another ``lease`` seconds (default: the original)."""
        if self._token is None:
            raise InvalidOption("once", "extend() works only inside a block that reserved")
        seconds = self._lease if lease is None else validate.lease_seconds(lease)
        extended = yield call(
            "processed_extend", scope=self.scope, key=self.key, token=self._token, lease=seconds
        )
        if not extended:
            raise ReservationLost(self.scope, self.key)


class Once(OnceBase, Blocking):
    """The context manager :meth:`Broker.once` returns; entering it yields whether this is
    the first time (``True``: run the effect) or the key is done (``False``: skip it)."""

    def __enter__(self) -> bool:
        return self._enter()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._exit(kind is not None)


class AsyncOnce(OnceBase, Awaiting):
    """``async with broker.once(scope, key) as first:`` — :class:`Once` for coroutines."""

    async def __aenter__(self) -> bool:
        return await self._enter()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self._exit(kind is not None)


def processed_key(key: object) -> str:
    """A processed key: a key string (see :func:`validate.key`), or an ``int`` — an order
    number straight from a payload — taken as its decimal text, so ``42`` and ``"42"`` are
    the same key. Anything else (``bool`` and ``float`` included) is refused."""
    if isinstance(key, int) and not isinstance(key, bool):
        if abs(key) >= 10**validate.MAX_KEY_LENGTH:  # str() of a huge int is refused, slowly
            raise InvalidName("key", f"is an integer longer than {validate.MAX_KEY_LENGTH} digits")
        key = int.__str__(key)
    return validate.required_key(key, "key")
