"""A subscription's flow limits, read and changed (docs/flow-control.md); the claim
statement enforces them (storage/operations/flow.py)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlbroker.core import validate
from sqlbroker.core.errors import NotFound
from sqlbroker.core.flow import Flow, FlowLimits, flow_limits
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.dead_letters import default_actor
from sqlbroker.features.faces import Plan, call


def flow_list(subscription: str | None) -> Plan[list[Flow]]:
    """Every subscription's flow (or one's: ``NotFound`` if it is unknown)."""
    if subscription is not None:
        validate_topic(subscription, "subscription")
    found: list[Flow] = yield call("flow_list", name=subscription)
    if subscription is not None and not found:
        raise NotFound(f"no subscription named {subscription!r}")
    return found


def flow_change(
    subscription: str,
    options: Mapping[str, object],
    *,
    reset: bool,
    actor: str | None = None,
    note: str | None = None,
) -> Plan[Flow]:
    """Change the limits named in ``options`` (``None``: remove that limit), the others
    kept (``reset=True``: the others removed), recorded in the audit trail as done by
    ``actor`` (default ``api:<user>``). Every value is checked before any SQL."""
    validate_topic(subscription, "subscription")
    validate.flag(reset, "reset")
    flow_limits(options)
    who = default_actor() if actor is None else validate.reason(actor, "actor")[:200]
    why = None if note is None else validate.reason(note, "note")
    base = FlowLimits() if reset else (yield from flow_list(subscription))[0].limits
    limits = flow_limits(options, base=base)
    if not (yield call("flow_set", name=subscription, limits=limits, actor=who, note=why)):
        raise NotFound(f"no subscription named {subscription!r}")
    return (yield from flow_list(subscription))[0]
