"""Flow limits: a subscription's concurrency caps, rate limits and fairness, and the claim
that obeys them (docs/flow-control.md).

The limits are columns of the subscription. The plain claim claims nothing from a
flow-limited subscription (one more condition on the primary-key probe it makes anyway),
so a subscription without limits claims exactly as before; :func:`claim_copies` sends a
flow-limited one's claims to ``message_claim_flow``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlbroker.core.flow import Claimed, Flow, FlowLimits, Rate
from sqlbroker.core.message import Delivery
from sqlbroker.storage.operations.admin import audit
from sqlbroker.storage.operations.subscriptions import Names
from sqlbroker.storage.plan import Plan, atomic, commit_point, query, reads
from sqlbroker.storage.rows import deliveries_of

if TYPE_CHECKING:
    from sqlbroker.storage.rows import UndecodableRow
    from sqlbroker.storage.seam import Settings


@atomic
def flow_set(
    settings: Settings,
    *,
    name: str,
    limits: FlowLimits,
    actor: str | None = None,
    note: str | None = None,
) -> Plan[bool]:
    """Set the subscription's flow limits (all of them); False if it is unknown. With an
    ``actor`` (an operator's change: ``Broker.set_flow``, the CLI) a change is recorded
    in the audit trail (action ``subscription.flow``: the limits before and after,
    ``actor`` and ``note``); a worker declaring its subscriber's limits gives none (its
    role may not write the audit trail). Setting the limits it has already writes
    nothing."""
    before = yield query("flow_list", name=name)
    if not before:
        return False
    previous = _limits_of(before[0])
    if previous == limits:
        return True
    rate, key_rate = limits.rate_limit, limits.key_rate_limit
    rows = yield query(
        "flow_set",
        name=name,
        max_running=limits.max_running,
        key_concurrency=limits.key_concurrency,
        rate_count=None if rate is None else rate.count,
        rate_period=None if rate is None else rate.period,
        key_rate_count=None if key_rate is None else key_rate.count,
        key_rate_period=None if key_rate is None else key_rate.period,
        fair=limits.fair,
    )
    if rows and actor is not None:
        detail = {
            "subscription": name,
            "before": _described(previous),
            "after": _described(limits),
            "note": note,
        }
        yield audit(actor, "subscription.flow", detail)
    return bool(rows)


def _described(limits: FlowLimits) -> dict[str, object]:
    """Flow limits as the audit trail shows them (rates as ``"100/min"``)."""
    rate, key_rate = limits.rate_limit, limits.key_rate_limit
    return {
        "max_running": limits.max_running,
        "key_concurrency": limits.key_concurrency,
        "rate_limit": None if rate is None else str(rate),
        "key_rate_limit": None if key_rate is None else str(key_rate),
        "fair": limits.fair,
    }


def _limits_of(row: Sequence[Any]) -> FlowLimits:
    """The limits of a ``flow_list`` row."""
    return FlowLimits(
        max_running=_cap(row[1]),
        key_concurrency=_cap(row[2]),
        rate_limit=_rate(row[3], row[4]),
        key_rate_limit=_rate(row[5], row[6]),
        fair=bool(row[7]),
    )


def _rate(count: object, period: object) -> Rate | None:
    if isinstance(count, int) and isinstance(period, int | float) and count > 0 and period > 0:
        return Rate(count, float(period))
    return None


def _cap(value: object) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


@reads
def flow_list(settings: Settings, *, name: str | None) -> Plan[list[Flow]]:
    """Every subscription's (or one's) flow limits, running copies and throttling."""
    rows = yield query("flow_list", name=name)
    return [
        Flow(
            subscription=str(row[0]),
            limits=_limits_of(row),
            running=int(row[8]),
            throttled_for=float(row[9] or 0.0),
        )
        for row in rows
    ]


class FlowLimited(Names):
    """The subscriptions this process last found flow-limited: their claims go to the
    flow claim first, skipping the plain claim's round trip (which would find nothing)."""


def claim_copies(
    settings: Settings, subscription: str, params: dict[str, Any]
) -> Plan[tuple[list[Delivery], list[UndecodableRow]]]:
    """The claim of :func:`messages.message_claim_many`: the plain statement, or for a
    flow-limited subscription ``message_claim_flow``, whose deliveries come as
    :class:`Claimed` (a worker then claims no more than it can start); when it took fewer
    than it asked for and a rate limit holds claims back, ``Claimed.wait`` says how long.

    Which one a subscription needs is learnt from the claims themselves: the plain
    statement claims nothing from a flow-limited subscription, the flow statement nothing
    from one without limits (or paused); only a claim that found nothing asks which it is.
    """
    limited = settings.flow_limited
    if subscription in limited:
        found = yield from _claim_limited(settings, subscription, params)
        if found is not None:
            return found
        limited.discard(subscription)
    rows = yield query("message_claim", subscription=subscription, **params)
    if rows:
        yield from _decode_after_commit(settings)
        return deliveries_of(rows)
    controlled = yield query("flow_controlled", subscription=subscription)
    if not controlled:
        return [], []
    limited.add(subscription)
    found = yield from _claim_limited(settings, subscription, params)
    return found if found is not None else ([], [])


def _decode_after_commit(settings: Settings) -> Plan[None]:
    """Where one writer at a time holds the database (SQLite), the claim commits before its
    rows are decoded: inside, the decoding (8 us a row) held the write lock 70% longer (a
    claim of 100: 1.9 ms, against 1.1)."""
    if settings.one_writer:
        yield commit_point()


def _claim_limited(
    settings: Settings, subscription: str, params: dict[str, Any]
) -> Plan[tuple[list[Delivery], list[UndecodableRow]] | None]:
    """The flow claim; ``None`` when it found nothing because the subscription has no
    limits (any more) or is paused."""
    rows = yield query("message_claim_flow", subscription=subscription, **params)
    if not rows:
        controlled = yield query("flow_controlled", subscription=subscription)
        if not controlled:
            return None
    wait = None
    if len(rows) < params["limit"]:
        found = yield query("flow_wait", subscription=subscription)
        subscription_wait, key_wait = found[0] if found else (None, None)
        # The subscription's bucket holds every claim back; the keys' only a claim that
        # took nothing (the least wait: the first key whose next claim is due).
        if subscription_wait is not None and subscription_wait > 0:
            wait = float(subscription_wait)
        elif not rows and key_wait is not None and key_wait > 0:
            wait = float(key_wait)
    if rows:
        yield from _decode_after_commit(settings)
    deliveries, damaged = deliveries_of(rows)
    return Claimed(deliveries, wait), damaged
