"""What crosses the storage seam besides core's types: leases and the requests made
under them, filters, and the small results of maintenance operations. The operations
themselves are in :mod:`sqlbroker.storage.operations`; what a backend is, in
:mod:`sqlbroker.storage.backend`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple, Protocol

from sqlbroker.core.message import (
    Delivery,
    ErrorInfo,
    storable_text,
)
from sqlbroker.core.validate import MAX_REASON
from sqlbroker.storage.rows import UndecodableRow

log = logging.getLogger("sqlbroker.storage")


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
    """How one leased copy's attempt ends: the one type that carries an outcome from the
    worker, the broker's ``complete``/``retry``/``dead_letter`` and the claim's
    undecodable rows into storage (``message_settle_many``, which checks it).

    - ``complete``: archived as completed; ``value`` is the handler's encoded result
      (``None``: nothing stored);
    - ``retry``: back to the queue after ``after`` seconds; a ``snooze`` gives the attempt
      back. Whether a failure is retried or dead-lettered is the retry policy's decision
      (:class:`~sqlbroker.RetryPolicy`), made before a settlement is built;
    - ``dead``: to the dead letters with ``reason`` (made storable and cut to
      ``MAX_REASON`` characters when written: a handler's ``Reject(reason)`` is not
      validated on the way);
    - ``cancel``: archived as cancelled (its message was cancelled while it ran).

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

    @classmethod
    def complete(cls, lease: Lease, value: bytes | None = None) -> Settlement:
        return cls("complete", lease, value)

    @classmethod
    def retry(
        cls, lease: Lease, after: float, error: ErrorInfo | None = None, *, snooze: bool = False
    ) -> Settlement:
        return cls("retry", lease, after=after, snooze=snooze, error=error)

    @classmethod
    def dead(cls, lease: Lease, reason: str, error: ErrorInfo | None = None) -> Settlement:
        return cls("dead", lease, reason=reason, error=error)

    @classmethod
    def cancel(cls, lease: Lease) -> Settlement:
        return cls("cancel", lease)


def storable_reason(reason: str) -> str:
    """A dead letter's reason as stored: storable text of at most ``MAX_REASON``."""
    return storable_text(str(reason)[:MAX_REASON])[:MAX_REASON]


def undecodable_deaths(damaged: Sequence[UndecodableRow]) -> list[Settlement]:
    """Dead-letter settlements for claimed rows that do not decode (reason ``undecodable``,
    error type ``sqlbroker.Undecodable``, the message naming the columns), each under the
    lease its claim issued; every claim path sends these to ``message_settle_many``."""
    for row in damaged:
        log.warning(
            "message %s does not decode (%s): dead-lettered",
            row.id,
            row.problem,
            extra={"delivery_id": row.id, "reason": "undecodable"},
        )
    return [
        Settlement.dead(Lease(id=row.id, token=row.lease_token), row.reason, row.error)
        for row in damaged
    ]


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Selects dead letters; every given field must match (``None`` matches anything)."""

    ids: tuple[int, ...] | None = None
    subscription: str | None = None
    topic: str | None = None
    error_type: str | None = None
    reason_contains: str | None = None
    dead_before: datetime | None = None
    dead_after: datetime | None = None

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__slots__)


@dataclass(frozen=True, slots=True)
class ReapResult:
    released: int
    dead: int


@dataclass(frozen=True, slots=True)
class RetentionBounds:
    """The longest and shortest retentions (seconds) that subscriptions have of their own;
    ``None`` when none has one."""

    archive_longest: float | None
    archive_shortest: float | None
    dead_longest: float | None
    dead_shortest: float | None


@dataclass(frozen=True, slots=True)
class InsertResult:
    """The message id for each input, in order: a fresh id, or an earlier duplicate's id;
    ``replaced``: the pending copies that took a publish's place (``replace``/``debounce``)
    instead of a new copy being enqueued."""

    message_ids: list[str]
    duplicates: int
    unrouted: int
    replaced: int = 0


ROLE_GROUPS = ("migrator", "producer", "consumer", "reader", "operator")
"""The PostgreSQL group roles, ``<prefix>_<group>`` (see docs/security.md)."""


@dataclass(frozen=True, slots=True)
class TenantRole:
    """A login role and the tenant it acts for."""

    role: str
    tenant: str


class ResultWatch(Protocol):
    """A watch on one message's results (see ``Backend.result_watch``)."""

    def wait(self, timeout: float) -> bool:
        """Block until a hint that the message's copies may have finished (``True``) or
        for ``timeout`` seconds (``False``). Hints can be lost: callers look up anyway."""


class AsyncResultWatch(Protocol):
    """:class:`ResultWatch` for coroutines."""

    async def wait(self, timeout: float) -> bool: ...
