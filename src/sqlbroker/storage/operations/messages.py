"""The life of a leased copy: claim, retry, dead-letter, extend, release, cancel, and the
reaper's side (expired leases, TTLs, headless keys, idempotency keys past their window).

Every removal from the hot table (dead letter, cancel, expiry, lost worker) returns the
removed rows as ``(id, subscription, ordering_key, state)``, and :func:`_promote_heads`
gives each ordering key whose head left its next copy: one rule, one home.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlbroker.core.message import Delivery
from sqlbroker.core.serde import encode_json
from sqlbroker.storage.base import (
    DeadRequest,
    Lease,
    ReapResult,
    RetryRequest,
    check_values,
    undecodable_deaths,
)
from sqlbroker.storage.columns import utc
from sqlbroker.storage.operations.flow import claim_copies
from sqlbroker.storage.plan import Plan, query, relaxed
from sqlbroker.storage.rows import error_json

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings

PROMOTE_BATCH = 1000
"""Due delayed copies a claim promotes at most (the rest follow at the next claims)."""

WORKER_LOST_REASON = "worker lost: the lease expired on the last attempt"
WORKER_LOST_TYPE = "sqlbroker.WorkerLost"
WORKER_LOST_MESSAGE = "the worker holding the message stopped acknowledging it"
WORKER_LOST_ERROR = encode_json(
    {"type": WORKER_LOST_TYPE, "message": "the lease expired without an ack"}
)
"""The last error of a copy whose lease expired and that goes back to the queue."""


def _leases(leases: Sequence[Lease]) -> dict[str, Any]:
    return {"ids": [lease.id for lease in leases], "tokens": [lease.token for lease in leases]}


def _promote_heads(removed: Sequence[Any]) -> Plan[None]:
    """Rows ``(id, subscription, ordering_key, state)`` just left the hot table: each key
    whose head was among them gets its next copy. A crash before this statement (on
    PostgreSQL it commits on its own) leaves the key headless until :func:`key_repair`."""
    heads = sorted(
        {(row[1], row[2]) for row in removed if row[2] is not None and row[3] != "blocked"}
    )
    if heads:
        yield query(
            "key_promote",
            subscriptions=[subscription for subscription, _ in heads],
            keys=[key for _, key in heads],
        )


@relaxed
def message_claim_many(
    settings: Settings,
    *,
    subscription: str,
    limit: int,
    lease: float,
    worker: str | None,
    max_attempts: int | None = None,
) -> Plan[list[Delivery]]:
    """Lease up to ``limit`` available copies, most urgent first (priority, then time,
    then id); count the attempt. ``max_attempts`` (a consumer's retry policy) replaces a
    copy's own limit, so that the reaper's quarantine follows the same limit as retries.
    Due delayed copies are promoted first, at most every few milliseconds per
    subscription (see :mod:`sqlbroker.storage.promotion`). A subscription with flow limits
    (caps, rate limits, fairness) is claimed within them (:mod:`.flow`). A claimed row that
    does not decode is dead-lettered (reason ``undecodable``) instead of being returned."""
    injected = settings.clock.now()
    if settings.promotion.due(subscription, None if injected is None else injected.timestamp()):
        yield query("message_promote_scheduled", subscription=subscription, limit=PROMOTE_BATCH)
    params: dict[str, Any] = {
        "limit": limit,
        "lease": lease,
        "worker": worker,
        "max_attempts": max_attempts,
        "claim_commit": settings.claim_commit,
    }
    deliveries, damaged = yield from claim_copies(settings, subscription, params)
    if damaged:
        yield from message_dead_many(settings, deaths=undecodable_deaths(damaged))
    return deliveries


def message_complete_many(
    settings: Settings, *, leases: Sequence[Lease], values: Sequence[bytes | None] | None = None
) -> Plan[list[int]]:
    """Archive the copies as completed (or only delete them, without ``archive_completed``);
    return the ids whose lease was still valid. ``values`` (aligned with ``leases``) are the
    handlers' encoded return values, stored as results in the same statement; with none
    the statement is the one without results, which costs nothing more."""
    check_values(leases, values)
    if not leases:
        return []
    if values is not None and any(value is not None for value in values):
        rows = yield query(
            "message_complete_valued",
            **_leases(leases),
            # JSON text (validated before): SQLite carries arrays as JSON, which has no bytes.
            values=[None if value is None else value.decode() for value in values],
            archive=settings.archive_completed,
            result_channel=settings.result_channel,
        )
    else:
        block = "message_complete" if settings.archive_completed else "message_complete_unarchived"
        rows = yield query(block, **_leases(leases))
    yield from _promote_heads(rows)
    return sorted(row[0] for row in rows)


def message_retry_many(settings: Settings, *, retries: Sequence[RetryRequest]) -> Plan[list[int]]:
    """Return leased copies to the queue after their delay (a snooze gives the attempt
    back); return the ids whose lease was still valid."""
    if not retries:
        return []
    rows = yield query(
        "message_retry",
        **_leases([r.lease for r in retries]),
        afters=[float(r.after) for r in retries],
        errors=[error_json(r.error) for r in retries],
        snoozes=[r.snooze for r in retries],
        channel=settings.notify_channel,
    )
    return sorted(row[0] for row in rows)


def message_dead_many(settings: Settings, *, deaths: Sequence[DeadRequest]) -> Plan[list[int]]:
    """Move leased copies to the dead letters; return the ids whose lease was valid."""
    if not deaths:
        return []
    rows = yield query(
        "message_dead",
        **_leases([d.lease for d in deaths]),
        reasons=[d.reason for d in deaths],
        error_types=[d.error.type if d.error else None for d in deaths],
        error_messages=[d.error.message if d.error else None for d in deaths],
        tracebacks=[d.error.traceback if d.error else None for d in deaths],
        dead_channel=settings.dead_channel,
    )
    yield from _promote_heads(rows)
    return sorted(row[0] for row in rows)


def message_extend_leases(
    settings: Settings, *, leases: Sequence[Lease], lease: float
) -> Plan[dict[int, datetime]]:
    """Push the lease expiry to now + ``lease``; return the new expiry per valid id."""
    if not leases:
        return {}
    rows = yield query("message_extend", **_leases(leases), lease=lease)
    return {row[0]: utc(row[1]) for row in rows}


def message_release_many(settings: Settings, *, leases: Sequence[Lease]) -> Plan[list[int]]:
    """Give claimed-but-unstarted copies back at once, without counting the attempt."""
    if not leases:
        return []
    rows = yield query("message_release", **_leases(leases))
    return sorted(row[0] for row in rows)


def message_cancel_many(settings: Settings, *, message_ids: Sequence[str]) -> Plan[int]:
    """Archive the copies of these messages that are not running as cancelled, and flag the
    running ones so that their workers stop the handlers (PostgreSQL wakes them with a
    NOTIFY on the cancel channel). Return how many copies were cancelled or flagged."""
    flagged = yield query("message_cancel_request", message_ids=list(message_ids))
    if flagged and settings.supports_notify:
        subscriptions = sorted({row[1] for row in flagged})
        yield query("notify_many", channel=settings.cancel_channel, payloads=subscriptions)
    rows = yield query("message_cancel", message_ids=list(message_ids))
    yield from _promote_heads(rows)
    return len(flagged) + len(rows)


def lease_release_expired(settings: Settings, *, limit: int) -> Plan[ReapResult]:
    """Return copies whose lease expired to the queue, or to the dead letters when their
    attempts are spent (reason ``worker lost``); a cancelled one is archived as cancelled
    (its worker was lost before it could)."""
    cancelled = yield query("lease_expired_cancelled", limit=limit)
    yield from _promote_heads(cancelled)
    dead = yield query(
        "lease_expired_dead",
        limit=limit,
        reason=WORKER_LOST_REASON,
        error_type=WORKER_LOST_TYPE,
        error_message=WORKER_LOST_MESSAGE,
        dead_channel=settings.dead_channel,
    )
    yield from _promote_heads(dead)
    released = yield query("lease_expired_release", limit=limit, last_error=WORKER_LOST_ERROR)
    return ReapResult(released=released.rowcount, dead=len(dead))


def message_expire(settings: Settings, *, limit: int) -> Plan[int]:
    """Archive copies whose TTL passed, as expired; return how many."""
    rows = yield query("message_expire", limit=limit)
    yield from _promote_heads(rows)
    return len(rows)


def key_repair(settings: Settings, *, limit: int) -> Plan[int]:
    """Promote the oldest blocked copy of every ordering key left without a head; return
    how many. A safety net: removals promote the next copy themselves."""
    done = yield query("key_repair", limit=limit)
    return done.rowcount


def dedupe_trim(settings: Settings, *, limit: int) -> Plan[int]:
    """Delete idempotency keys whose window has passed; return how many."""
    done = yield query("dedupe_trim", limit=limit)
    return done.rowcount
