"""What crosses the storage seam besides core's types (settlements and their leases are
:mod:`sqlbroker.core.settlements`'): filters, and the small results of maintenance
operations. The operations themselves are in :mod:`sqlbroker.storage.operations`; what a
backend is, in :mod:`sqlbroker.storage.backend`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlbroker.core.message import storable_text
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.core.validate import MAX_REASON
from sqlbroker.storage.rows import UndecodableRow

log = logging.getLogger("sqlbroker.storage")


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


# Not frozen: nothing changes one, and a frozen dataclass costs a call per field to make
# (one is made for every publish).
@dataclass(slots=True)
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
