"""How a leased copy's attempt ends: the one settlement type, from the retry policy's
decision through the worker and the broker's ``complete``/``retry``/``dead_letter`` to
storage (``message_settle_many``, which checks it)."""

from __future__ import annotations

from typing import Literal, NamedTuple

from sqlbroker.core.message import Delivery, ErrorInfo


class Lease(NamedTuple):
    """Proof of a claim: the delivery's id and the token its claim issued (a named tuple,
    as :class:`Settlement`: one is built per settled copy)."""

    id: int
    token: str

    @classmethod
    def of(cls, delivery: Delivery) -> Lease:
        return cls(delivery.id, delivery.lease_token)


SettleKind = Literal["complete", "retry", "dead", "cancel"]
SETTLE_KINDS: tuple[SettleKind, ...] = ("complete", "retry", "dead", "cancel")


class Settlement(NamedTuple):
    """How one leased copy's attempt ends:

    - ``complete``: archived as completed; ``value`` is the handler's encoded result
      (``None``: nothing stored);
    - ``retry``: back to the queue after ``after`` seconds; a ``snooze`` gives the attempt
      back. Whether a failure is retried or dead-lettered is the retry policy's decision
      (:meth:`~sqlbroker.RetryPolicy.decide`), which returns the settlement;
    - ``dead``: to the dead letters with ``reason`` (made storable and cut to
      ``MAX_REASON`` characters when written: a handler's ``Reject(reason)`` is not
      validated on the way);
    - ``cancel``: archived as cancelled (its message was cancelled while it ran).

    The constructors take the :class:`Delivery` settled, kept in ``delivery`` for the
    worker's hooks and metrics (storage reads only the lease), or a bare :class:`Lease`.
    A named tuple: the write-back builds one per outcome, five times faster than a frozen
    dataclass.
    """

    kind: SettleKind
    lease: Lease
    value: bytes | None = None
    after: float = 0.0
    snooze: bool = False
    reason: str = ""
    error: ErrorInfo | None = None
    delivery: Delivery | None = None

    @classmethod
    def complete(cls, held: Delivery | Lease, value: bytes | None = None) -> Settlement:
        if isinstance(held, Lease):
            return cls("complete", held, value)
        # One per handled message: the tuples are built without the named tuples' Python
        # constructors (the fields in order, with their defaults).
        lease = tuple.__new__(Lease, (held.id, held.lease_token))
        return tuple.__new__(cls, ("complete", lease, value, 0.0, False, "", None, held))

    @classmethod
    def retry(
        cls,
        held: Delivery | Lease,
        after: float,
        error: ErrorInfo | None = None,
        *,
        snooze: bool = False,
    ) -> Settlement:
        lease, delivery = _lease(held)
        return cls("retry", lease, after=after, snooze=snooze, error=error, delivery=delivery)

    @classmethod
    def dead(
        cls, held: Delivery | Lease, reason: str, error: ErrorInfo | None = None
    ) -> Settlement:
        lease, delivery = _lease(held)
        return cls("dead", lease, reason=reason, error=error, delivery=delivery)

    @classmethod
    def cancel(cls, held: Delivery | Lease) -> Settlement:
        lease, delivery = _lease(held)
        return cls("cancel", lease, delivery=delivery)


def _lease(held: Delivery | Lease) -> tuple[Lease, Delivery | None]:
    if isinstance(held, Lease):
        return held, None
    return Lease(held.id, held.lease_token), held
