"""Subscriptions: create or extend one with patterns, and list them. (Creating a queue on
its first publish, and deleting, still live with publishing in each backend.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlbroker.core.message import Subscription
from sqlbroker.core.topics import pattern_regex
from sqlbroker.storage.plan import Plan, atomic, named, query, reads
from sqlbroker.storage.rows import subscriptions_of

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


@atomic
def subscription_upsert(
    settings: Settings, *, name: str, patterns: Sequence[str], replace: bool
) -> Plan[Subscription]:
    """Create the subscription ``name`` or add ``patterns`` to it (``replace``: set them to
    exactly these). Past a limit (core/limits.py) it raises ``LimitExceeded`` and the
    transaction writes nothing."""
    yield query("subscription_insert", name=name)
    if replace:
        yield query("subscription_patterns_clear", name=name)
    yield query(
        "subscription_patterns_insert",
        name=name,
        patterns=list(patterns),
        regexes=[pattern_regex(pattern) for pattern in patterns],
    )
    ((own, subscriptions, total),) = yield query("subscription_room", name=name)
    settings.limits.check_room(
        subscription=name, own_patterns=own, subscriptions=subscriptions, patterns=total
    )
    rows = yield named("subscription_get", name=name)
    return subscriptions_of(rows)[0]


@reads
def subscription_list(settings: Settings) -> Plan[list[Subscription]]:
    """Every subscription with its patterns, by name."""
    rows = yield named("subscription_list")
    return subscriptions_of(rows)
