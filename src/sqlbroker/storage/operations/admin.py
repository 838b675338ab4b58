"""Listings and the operator's actions: pending messages, dead letters (list, replay,
purge), the archive, per-subscription stats and table counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlbroker.core.message import (
    ArchivedMessage,
    DeadLetter,
    Outcome,
    PendingMessage,
    State,
    SubscriptionStats,
    error_type_matches,
)
from sqlbroker.core.serde import encode_json
from sqlbroker.storage.base import DeadFilter
from sqlbroker.storage.plan import Plan, atomic, named, query, reads
from sqlbroker.storage.rows import archived_of, dead_letter_of, pending_of

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


@reads
def message_list(
    settings: Settings, *, subscription: str | None, state: State | None, limit: int
) -> Plan[list[PendingMessage]]:
    """Copies still in the queue, oldest first; a scheduled copy whose time has come is
    listed as available (the next claim promotes it)."""
    rows = yield named(
        "message_list",
        subscription=subscription,
        state=state.value if state else None,
        limit=limit,
    )
    return [pending_of(row) for row in rows]


def _dead_filter(where: DeadFilter) -> dict[str, Any]:
    exact, suffix = error_type_matches(where.error_type) if where.error_type else ([], "")
    return {
        "ids": None if where.ids is None else list(where.ids),
        "subscription": where.subscription,
        "topic": where.topic,
        "error_type": where.error_type,
        "error_types": exact,
        "error_suffix": suffix,
        "reason_contains": where.reason_contains,
        "dead_before": where.dead_before,
        "dead_after": where.dead_after,
    }


@reads
def dead_list(
    settings: Settings, *, where: DeadFilter, limit: int, after_id: int | None
) -> Plan[list[DeadLetter]]:
    """Dead letters matching ``where``, by id, after ``after_id``."""
    rows = yield named("dead_select", **_dead_filter(where), after_id=after_id, limit=limit)
    return [dead_letter_of(row) for row in rows]


@reads
def dead_get(settings: Settings, *, id: int) -> Plan[DeadLetter | None]:
    found = yield from dead_list(settings, where=DeadFilter(ids=(id,)), limit=1, after_id=None)
    return found[0] if found else None


def audit(actor: str, action: str, detail: dict[str, Any]) -> Any:
    """The statement recording an operator's action in the audit trail."""
    return query("audit_insert", actor=actor, action=action, detail=encode_json(detail))


@atomic
def dead_replay(
    settings: Settings, *, where: DeadFilter, actor: str, note: str | None
) -> Plan[list[int]]:
    """Put matching dead letters back in their subscription (created again if it was
    deleted) with attempts reset and the replay counted; record who did it in the audit
    trail. Return the new delivery ids."""
    ids = [row[0] for row in (yield query("dead_lock", **_dead_filter(where)))]
    if not ids:
        return []
    if settings.key_locks:
        # Replayed copies join their key's line like new publishes: take the key locks.
        keys = sorted(row[0] for row in (yield query("dead_keys", ids=ids)))
        if keys:
            yield query("key_lock", keys=keys)
    yield query("dead_subscriptions_ensure", ids=ids)
    replayed = yield query("dead_replay_insert", ids=ids)
    yield query("dead_delete_ids", ids=ids)
    new_ids = sorted(row[0] for row in replayed)
    yield audit(actor, "dead.replay", {"dead_ids": ids, "delivery_ids": new_ids, "note": note})
    if settings.supports_notify:
        subscriptions = sorted({row[1] for row in replayed})
        yield query("notify_many", channel=settings.notify_channel, payloads=subscriptions)
    return new_ids


@atomic
def dead_purge(settings: Settings, *, where: DeadFilter, actor: str, note: str | None) -> Plan[int]:
    """Delete matching dead letters for good; record who did it. Return how many."""
    ids = [row[0] for row in (yield query("dead_lock", **_dead_filter(where)))]
    if ids:
        yield query("dead_delete_ids", ids=ids)
        yield audit(actor, "dead.purge", {"dead_ids": ids, "note": note})
    return len(ids)


@reads
def archive_list(
    settings: Settings,
    *,
    subscription: str | None,
    outcome: Outcome | None,
    message_id: str | None,
    limit: int,
) -> Plan[list[ArchivedMessage]]:
    """Archived copies, newest first."""
    rows = yield named(
        "archive_list",
        subscription=subscription,
        outcome=outcome.value if outcome else None,
        message_id=message_id,
        limit=limit,
    )
    return [archived_of(row) for row in rows]


@reads
def stats_collect(settings: Settings) -> Plan[list[SubscriptionStats]]:
    """Every subscription, and any name that still has copies or dead letters (a deleted
    subscription's dead letters stay), by name."""
    rows = yield query("stats")
    return [
        SubscriptionStats(
            subscription=row[0],
            ready=row[1],
            scheduled=row[2],
            running=row[3],
            blocked=row[4],
            dead=row[5],
            oldest_ready_age=row[6],
            paused=bool(row[7]),
        )
        for row in rows
    ]
