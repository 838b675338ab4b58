"""The life of a leased copy: claim, settle (complete, retry, dead-letter, cancel), extend,
release, cancel by message id, and the reaper's side (expired leases, TTLs, headless keys,
idempotency keys past their window).

Every removal from the hot table (dead letter, cancel, expiry, lost worker) returns the
removed rows as ``(id, subscription, ordering_key, state)``, and :func:`_promote_heads`
gives each ordering key whose head left its next copy: one rule, one home.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.message import Delivery
from sqlbroker.core.serde import encode_json
from sqlbroker.core.settlements import SETTLE_KINDS, Lease, Settlement
from sqlbroker.storage.base import ReapResult, storable_reason, undecodable_deaths
from sqlbroker.storage.columns import utc
from sqlbroker.storage.operations.admin import audit
from sqlbroker.storage.operations.flow import claim_copies
from sqlbroker.storage.plan import (
    Plan,
    StatementFailed,
    ahead,
    atomic,
    changed_count,
    query,
    relaxed,
)
from sqlbroker.storage.rows import error_json

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings

log = logging.getLogger("sqlbroker.storage")

PROMOTE_BATCH = 1000
"""Due delayed copies a claim promotes at most (the rest follow at the next claims)."""

KEY_WAIT = 0.2
KEY_WAIT_TRIES = 10
"""How long (seconds, in that many tries) a promotion waits for a publisher holding its
key's lock before leaving the key to the reaper's key repair (see _promote_heads)."""

WORKER_LOST_REASON = "worker lost: the lease expired on the last attempt"
WORKER_LOST_TYPE = "sqlbroker.WorkerLost"
WORKER_LOST_MESSAGE = "the worker holding the message stopped acknowledging it"
WORKER_LOST_ERROR = encode_json(
    {"type": WORKER_LOST_TYPE, "message": "the lease expired without an ack"}
)
"""The last error of a copy whose lease expired and that goes back to the queue."""


def _leases(items: Sequence[Lease] | Sequence[Settlement]) -> dict[str, Any]:
    leases = [item.lease if isinstance(item, Settlement) else item for item in items]
    return {"ids": [lease.id for lease in leases], "tokens": [lease.token for lease in leases]}


def _promote_heads(settings: Settings, removed: Sequence[Any]) -> Plan[None]:
    """Rows ``(id, subscription, ordering_key, state)`` just left the hot table: each key
    whose head was among them gets its next copy. A crash before this statement (on
    PostgreSQL it commits on its own) leaves the key headless until :func:`key_repair`;
    so does a promotion that fails where the removal has committed already (PostgreSQL's
    autocommit: a deadlock, ``lock_timeout``, a dropped connection; see
    :class:`~sqlbroker.storage.plan.StatementFailed`): the removal stands, and the
    operation reports it as done rather than failing, which would have its caller retry a
    removal that happened (a worker then reported its settled copies' leases lost). In a
    transaction the failure undoes the removal, and the error goes to the caller.

    Where publishers of a key hold its lock (PostgreSQL), a key whose promotion found no
    copy to promote may have one being published right now, queued blocked behind the head
    its publisher still saw, that the promotion could not see yet. For those keys only the
    lock is taken, in a statement of its own, and the promotion runs again: the publisher
    has committed by then, so the second promotion sees its copy. Run alone the lock is a
    barrier, released at once; in a transaction it is held to the commit, and a later
    publisher waits for the removal to be visible. The wait is bounded (:data:`KEY_WAIT`):
    a key whose publisher holds its lock longer (a keyed publish in a long transaction of
    the caller's) is left to :func:`key_repair` rather than holding up the worker."""
    heads = sorted(
        {(row[1], row[2]) for row in removed if row[2] is not None and row[3] != "blocked"}
    )
    if not heads:
        return
    try:
        promoted = yield from _promote(heads)
        empty = sorted(set(heads) - promoted) if settings.key_locks else []
        if not empty:
            return
        busy = sorted({key for _, key in empty})
        for attempt in range(KEY_WAIT_TRIES):
            if attempt:
                yield query("pause", seconds=KEY_WAIT / KEY_WAIT_TRIES)
            busy = [row[0] for row in (yield query("key_try_lock", keys=busy))]
            if not busy:
                break
        yield from _promote(empty)
    except StatementFailed as failed:
        log.warning(
            "the next copies of %d ordering keys were not promoted after their heads left"
            " (%s); the reaper's key repair will promote them",
            len(heads),
            failed,
        )


def _promote(heads: Sequence[tuple[str, str]]) -> Plan[set[tuple[str, str]]]:
    """``key_promote`` for these distinct ``(subscription, key)`` pairs; the pairs it
    promoted where publishers hold key locks (``settings.key_locks``: only they are read;
    SQLite's block returns none)."""
    rows = yield query(
        "key_promote",
        subscriptions=[subscription for subscription, _ in heads],
        keys=[key for _, key in heads],
    )
    return {(row[0], row[1]) for row in rows}


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
        # In the claim's round trip (PostgreSQL: one pipeline, one implicit transaction,
        # so the claim sees the copies it made due): on its own it was a round trip and
        # a durable commit in front of every fifth claim or so of a worker's wake-ups.
        yield ahead("message_promote_scheduled", subscription=subscription, limit=PROMOTE_BATCH)
    params: dict[str, Any] = {
        "limit": limit,
        "lease": lease,
        "worker": worker,
        "max_attempts": max_attempts,
        "claim_commit": settings.claim_commit,
        "token": os.urandom(16).hex(),  # SQLite: its copies' lease tokens (with their ids)
    }
    deliveries, damaged = yield from claim_copies(settings, subscription, params)
    if damaged:
        yield from message_settle_many(settings, settlements=undecodable_deaths(damaged))
    return deliveries


def message_settle_many(
    settings: Settings, *, settlements: Sequence[Settlement]
) -> Plan[list[int]]:
    """Settle leased copies — completes, retries, dead letters and cancels, mixed — and
    return the ids whose lease was still valid.

    PostgreSQL writes the whole batch in one statement (``message_settle``), except a batch
    of completes without results, which runs the plain complete statement: the drain's
    case, and its cheapest. SQLite has no data-changing ``WITH``: it runs one block per
    kind present, inside the one ``BEGIN IMMEDIATE`` every write operation runs in. A
    copy may appear once per call (a write reports valid leases by copy)."""
    if not settlements:
        return []
    ids = [s.lease.id for s in settlements]
    kinds = {s.kind for s in settlements}
    unknown = kinds - set(SETTLE_KINDS)
    if unknown:
        named = ", ".join(sorted(map(repr, unknown)))
        raise InvalidOption("kind", f"must be one of {', '.join(SETTLE_KINDS)}, not {named}")
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise InvalidOption(
            "settlements", f"holds copy {twice[0]} twice: settle each copy once per call"
        )
    removed: list[Any] = []  # rows of the copies that left the hot table
    done: list[int] = []
    if kinds == {"complete"} and [s.value for s in settlements].count(None) == len(ids):
        done, removed = yield from _complete(settings, settlements)
    elif settings.writes_in_with:
        rows: list[Any] = yield query(
            "message_settle",
            **_leases(settlements),
            kinds=[s.kind for s in settlements],
            **_settle_params(settlements),
            archive=settings.archive_completed,
            channel=settings.notify_channel,
            dead_channel=settings.dead_channel,
            result_channel=settings.result_channel,
        )
        removed = [row for row in rows if row[4]]
        done = [row[0] for row in rows]
    else:
        for kind in SETTLE_KINDS:
            group = [s for s in settlements if s.kind == kind]
            if not group:
                continue
            if kind == "complete" and all(s.value is None for s in group):
                _, rows = yield from _complete(settings, group)  # every row: SQLite's
            else:
                block, columns = _SQLITE_SETTLE[kind]
                params = _settle_params(group)
                rows = yield query(
                    block,
                    **_leases(group),
                    **{column: params[column] for column in columns},
                    archive=settings.archive_completed,
                )
            done.extend(row[0] for row in rows)
            if kind != "retry":
                removed.extend(rows)
    yield from _promote_heads(settings, removed)
    return sorted(done)


def _complete(
    settings: Settings, settlements: Sequence[Settlement]
) -> Plan[tuple[list[int], list[Any]]]:
    """The plain complete (no values) of these leases: the copies of the valid ones leave
    the hot table, archived unless ``archive_completed=False``. Their ids, and the rows
    ``(id, subscription, ordering_key, state)`` of those whose key may still want its next
    copy (:func:`_promote_heads`). PostgreSQL's ``_keyed`` blocks, run where a copy may
    have a key (a bare lease may), promote the next copies in the same statement (else
    the keyed drain's third statement per batch) and flag the rows whose key they
    promoted. SQLite's blocks archive (or not) and read back; the deletion by id is a
    statement of its own (``message_complete_delete``)."""
    keyed = settings.writes_in_with and any(
        s.delivery is None or s.delivery.key is not None for s in settlements
    )
    block = _COMPLETE_BLOCKS[settings.archive_completed, keyed]
    rows = yield query(block, **_leases(settlements))
    ids = [row[0] for row in rows]
    if keyed:
        return ids, [row for row in rows if not row[4]]
    if not settings.writes_in_with and rows:
        yield query("message_complete_delete", ids=ids)
    return ids, rows


_COMPLETE_BLOCKS = {
    (True, False): "message_complete",
    (False, False): "message_complete_unarchived",
    (True, True): "message_complete_keyed",
    (False, True): "message_complete_unarchived_keyed",
}
"""The plain complete's block by ``(archive_completed, keyed)`` (see :func:`_complete`)."""


_SQLITE_SETTLE = {
    "complete": ("message_complete_valued", ("values",)),
    "retry": ("message_retry", ("afters", "errors", "snoozes")),
    "dead": ("message_dead", ("reasons", "error_types", "error_messages", "tracebacks")),
    "cancel": ("message_cancel_leased", ()),
}
"""SQLite's block for each kind of settlement (a complete's with values: see
:func:`_complete` for the plain one) and the columns of :func:`_settle_params` it reads
(``archive``: only the complete's)."""


def _settle_params(settlements: Sequence[Settlement]) -> dict[str, list[Any]]:
    """The per-copy columns of a settlement, one array each (unused ones are NULL)."""
    errors = [s.error for s in settlements]
    return {
        # JSON text (validated before): SQLite carries arrays as JSON, which has no bytes.
        "values": [None if s.value is None else s.value.decode() for s in settlements],
        "afters": [float(s.after) for s in settlements],
        "snoozes": [s.snooze for s in settlements],
        "errors": [error_json(s.error) if s.kind == "retry" else None for s in settlements],
        "reasons": [storable_reason(s.reason) if s.kind == "dead" else None for s in settlements],
        "error_types": [e.type if e else None for e in errors],
        "error_messages": [e.message if e else None for e in errors],
        "tracebacks": [e.traceback if e else None for e in errors],
    }


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


@atomic
def message_cancel_many(
    settings: Settings, *, message_ids: Sequence[str], actor: str, note: str | None = None
) -> Plan[int]:
    """Archive the copies of these messages that are not running as cancelled, and flag the
    running ones so that their workers stop the handlers (PostgreSQL wakes them with a
    NOTIFY on the cancel channel); record who did it in the audit trail (action
    ``message.cancel``) when it reached a copy. Return how many copies were cancelled or
    flagged."""
    flagged = yield query("message_cancel_request", message_ids=list(message_ids))
    if flagged and settings.supports_notify:
        subscriptions = sorted({row[1] for row in flagged})
        yield query("notify_many", channel=settings.cancel_channel, payloads=subscriptions)
    rows = yield query("message_cancel", message_ids=list(message_ids))
    yield from _promote_heads(settings, rows)
    if flagged or rows:
        detail = {
            "message_ids": list(message_ids),
            "cancelled": len(rows),
            "flagged": len(flagged),
            "note": note,
        }
        yield audit(actor, "message.cancel", detail)
    return len(flagged) + len(rows)


def lease_release_expired(settings: Settings, *, limit: int) -> Plan[ReapResult]:
    """Return copies whose lease expired to the queue, or to the dead letters when their
    attempts are spent (reason ``worker lost``); a cancelled one is archived as cancelled
    (its worker was lost before it could).

    Only copies with attempts left go back to the queue: a spent copy the dead-letter
    statement did not take (beyond its ``limit``, or, on PostgreSQL where each statement
    reads the clock anew, a lease that expired between the two statements) stays until
    the next pass dead-letters it, rather than being claimed past its limit."""
    cancelled = yield query("lease_expired_cancelled", limit=limit)
    yield from _promote_heads(settings, cancelled)
    dead = yield query(
        "lease_expired_dead",
        limit=limit,
        reason=WORKER_LOST_REASON,
        error_type=WORKER_LOST_TYPE,
        error_message=WORKER_LOST_MESSAGE,
        dead_channel=settings.dead_channel,
    )
    yield from _promote_heads(settings, dead)
    released = yield query("lease_expired_release", limit=limit, last_error=WORKER_LOST_ERROR)
    return ReapResult(released=released.rowcount, dead=len(dead))


def message_expire(settings: Settings, *, limit: int) -> Plan[int]:
    """Archive copies whose TTL passed, as expired; return how many."""
    rows = yield query("message_expire", limit=limit)
    yield from _promote_heads(settings, rows)
    return len(rows)


def key_repair(settings: Settings, *, limit: int) -> Plan[int]:
    """Promote the oldest blocked copy of every ordering key left without a head; return
    how many. A safety net: removals promote the next copy themselves."""
    return changed_count("key_repair", limit=limit)


def dedupe_trim(settings: Settings, *, limit: int) -> Plan[int]:
    """Delete idempotency keys whose window has passed; return how many."""
    return changed_count("dedupe_trim", limit=limit)
