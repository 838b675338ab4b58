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
from typing import Protocol

from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.message import (
    Delivery,
    ErrorInfo,
    storable_text,
)
from sqlbroker.core.validate import MAX_REASON
from sqlbroker.storage.rows import UndecodableRow

log = logging.getLogger("sqlbroker.storage")


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of a claim: the delivery's id and the token its claim issued."""

    id: int
    token: str

    @classmethod
    def of(cls, delivery: Delivery) -> Lease:
        return cls(id=delivery.id, token=delivery.lease_token)


@dataclass(frozen=True, slots=True)
class RetryRequest:
    """Back to the queue after ``after`` seconds; a ``snooze`` gives the attempt back."""

    lease: Lease
    after: float
    error: ErrorInfo | None
    snooze: bool = False


@dataclass(frozen=True, slots=True)
class DeadRequest:
    """To the dead letters; ``reason`` is made storable (``storable_text``) and cut to
    ``MAX_REASON`` characters (a handler's ``Reject(reason)`` is not validated on the way)."""

    lease: Lease
    reason: str
    error: ErrorInfo | None

    def __post_init__(self) -> None:
        reason = storable_text(str(self.reason)[:MAX_REASON])[:MAX_REASON]
        object.__setattr__(self, "reason", reason)


def check_values(leases: Sequence[Lease], values: Sequence[bytes | None] | None) -> None:
    """``message_complete_many``'s ``values`` are aligned with its leases (checked before
    any SQL runs)."""
    if values is not None and len(values) != len(leases):
        raise InvalidOption(
            "values", f"has {len(values)} entries for {len(leases)} leases: give one per lease"
        )


def undecodable_deaths(damaged: Sequence[UndecodableRow]) -> list[DeadRequest]:
    """Dead-letter requests for claimed rows that do not decode (reason ``undecodable``,
    error type ``sqlbroker.Undecodable``, the message naming the columns), each under the
    lease its claim issued; every claim path sends these to ``message_dead_many``."""
    for row in damaged:
        log.warning(
            "message %s does not decode (%s): dead-lettered",
            row.id,
            row.problem,
            extra={"delivery_id": row.id, "reason": "undecodable"},
        )
    return [
        DeadRequest(
            lease=Lease(id=row.id, token=row.lease_token), reason=row.reason, error=row.error
        )
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
    """The message id for each input, in order: a fresh id, or an earlier duplicate's id."""

    message_ids: list[str]
    duplicates: int
    unrouted: int


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
