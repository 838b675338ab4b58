"""Subscriptions: create or extend one with patterns, create a queue on first use, list
and delete them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlbroker.core.message import Subscription
from sqlbroker.core.topics import pattern_regex
from sqlbroker.storage.plan import Plan, atomic, changed, named, query, reads
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
    yield from _patterns_add(settings, name=name, patterns=patterns)
    rows = yield named("subscription_get", name=name)
    return subscriptions_of(rows)[0]


def _patterns_add(settings: Settings, *, name: str, patterns: Sequence[str]) -> Plan[None]:
    """Give the subscription ``name`` these patterns too, within the limits (raising
    ``LimitExceeded`` otherwise: the caller's transaction then writes nothing)."""
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


@reads
def subscription_list(settings: Settings) -> Plan[list[Subscription]]:
    """Every subscription with its patterns, by name."""
    rows = yield named("subscription_list")
    return subscriptions_of(rows)


class Names:
    """Subscription names a process remembers, at most ``LIMIT`` (all forgotten when it is
    reached: a name forgotten costs a statement more, never a wrong answer)."""

    LIMIT = 10_000

    def __init__(self, names: set[str] | None = None) -> None:
        self._names: set[str] = set() if names is None else names

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def add(self, name: str) -> None:
        if len(self._names) >= self.LIMIT:
            self._names.clear()
        self._names.add(name)

    def discard(self, name: str) -> None:
        self._names.discard(name)


class KnownQueues(Names):
    """The queues this process saw exist (PostgreSQL): a send to one of them is a single
    statement, which creates the queue again if it was deleted meanwhile, without the
    check of the limits that a queue's first send makes.

    A queue is learnt only once it was seen committed (a creation found it there already)
    and only by an operation in a transaction of its own: a queue created by a transaction
    that then rolls back (the caller's, or ``backend.begin()``'s) is never believed to
    exist. Transactions of several operations read the names through
    :meth:`in_transactions` and learn none."""

    def __init__(self, names: set[str] | None = None, *, learns: bool = True) -> None:
        super().__init__(names)
        self._learns = learns

    def in_transactions(self) -> KnownQueues:
        """The same names, for transactions of several operations: read, never learnt."""
        return KnownQueues(self._names, learns=False)

    def add(self, name: str) -> None:
        """Learn that ``name`` exists, committed (ignored by :meth:`in_transactions`)."""
        if self._learns:
            super().add(name)


def queue_create(settings: Settings, *, name: str) -> Plan[bool]:
    """Create the queue ``name`` when it does not exist (a subscription whose only pattern
    is its name) and check the limits on subscriptions and patterns (the error rolls the
    creation back). Returns whether it was created."""
    created = yield query("queue_create", name=name)
    if created:
        yield from _patterns_add(settings, name=name, patterns=[name])
    return bool(created)


@atomic
def subscription_ensure(settings: Settings, *, name: str) -> Plan[bool]:
    """Create the queue ``name`` on first use: a subscription whose only pattern is its
    name. An existing subscription is left as it is. Returns whether it was created."""
    created = yield from queue_create(settings, name=name)
    if settings.known_queues is not None and not created:
        settings.known_queues.add(name)  # found committed: see KnownQueues
    return created


def subscription_delete(settings: Settings, *, name: str) -> Plan[bool]:
    """Delete the subscription ``name`` and its copies; False if there was none."""
    if settings.known_queues is not None:
        settings.known_queues.discard(name)
    return (yield from changed("subscription_delete", name=name))
