"""Dead-letter administration: list, show, replay and purge, by id or by filter.

Every replay and purge is recorded in the audit table with who did it and why, whichever
face (API, CLI, dashboard) asked for it.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption, NotFound
from sqlbroker.core.message import DeadLetter
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.faces import Awaiting, Blocking, Part, Plan, call, operation
from sqlbroker.storage.base import DeadFilter


class DeadSelection(TypedDict, total=False):
    """Which dead letters: each given filter must match (``None``: that filter is off).

    ``error_type`` matches the exception's stored name (``sqlbroker.Reject``,
    ``ValueError``, ``myapp.errors.PaymentError``), its full module path, or its last
    part(s): ``Reject`` finds ``sqlbroker.Reject`` and any other class named ``Reject``."""

    subscription: str | None
    topic: str | None
    error_type: str | None
    reason_contains: str | None
    dead_before: datetime | None
    dead_after: datetime | None


DEAD_SELECTION = DeadSelection.__optional_keys__


def make_filter(ids: Iterable[int] | None = None, **selection: Unpack[DeadSelection]) -> DeadFilter:
    """Validate filter arguments into a :class:`DeadFilter`."""
    validate.known_options(selection, DEAD_SELECTION, "dead-letter selection")
    id_tuple: tuple[int, ...] | None = None
    if ids is not None:
        id_tuple = tuple(
            validate.integer(value, "ids", minimum=1, maximum=2**63 - 1)
            for value in validate.items(ids, "ids", "dead-letter ids")
        )
    for field in ("error_type", "reason_contains"):
        if (value := selection.get(field)) is not None:
            validate.text(value, field, maximum=validate.MAX_REASON)
    subscription, topic = selection.get("subscription"), selection.get("topic")
    before, after = selection.get("dead_before"), selection.get("dead_after")
    return DeadFilter(
        ids=id_tuple,
        subscription=None if subscription is None else validate_topic(subscription, "subscription"),
        topic=None if topic is None else validate_topic(topic, "topic"),
        error_type=selection.get("error_type"),
        reason_contains=selection.get("reason_contains"),
        dead_before=None if before is None else validate.point_in_time(before, "dead_before"),
        dead_after=None if after is None else validate.point_in_time(after, "dead_after"),
    )


class DeadLettersBase(Part):
    """``broker.dead_letters``: inspect and act on messages that failed for good."""

    @operation
    def list(
        self,
        *,
        limit: int = 100,
        after_id: int | None = None,
        **selection: Unpack[DeadSelection],
    ) -> Plan[builtins.list[DeadLetter]]:
        """Dead letters matching every given filter (:class:`DeadSelection`), oldest
        first; page with ``after_id``."""
        where = make_filter(**selection)
        limit = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
        if after_id is not None:
            after_id = validate.integer(after_id, "after_id", minimum=0, maximum=2**63 - 1)
        found: builtins.list[DeadLetter] = yield call(
            "dead_list", where=where, limit=limit, after_id=after_id
        )
        return found

    @operation
    def get(self, id: int) -> Plan[DeadLetter]:
        """One dead letter by id; raises ``NotFound``."""
        validate.integer(id, "id", minimum=1, maximum=2**63 - 1)
        found: DeadLetter | None = yield call("dead_get", id=id)
        if found is None:
            raise NotFound(f"no dead letter with id {id}")
        return found

    @operation
    def replay(
        self,
        ids: Iterable[int] | None = None,
        *,
        all: bool = False,
        actor: str | None = None,
        note: str | None = None,
        **selection: Unpack[DeadSelection],
    ) -> Plan[builtins.list[int]]:
        """Send dead letters back to their subscription with attempts reset and the replay
        counted. Returns the new delivery ids. With no ids and no filter, ``all=True`` is
        required, so that an empty call never replays everything by accident."""
        replayed: builtins.list[int] = yield from self._act(
            "dead_replay", ids, all, actor, note, selection
        )
        return replayed

    @operation
    def purge(
        self,
        ids: Iterable[int] | None = None,
        *,
        all: bool = False,
        actor: str | None = None,
        note: str | None = None,
        **selection: Unpack[DeadSelection],
    ) -> Plan[int]:
        """Delete dead letters for good; returns how many. Same selection rules as replay."""
        purged: int = yield from self._act("dead_purge", ids, all, actor, note, selection)
        return purged

    @staticmethod
    def _act(
        block: str,
        ids: Iterable[int] | None,
        everything: bool,
        actor: str | None,
        note: str | None,
        selection: DeadSelection,
    ) -> Plan[Any]:
        """Validate a replay's or purge's selection, actor and note, then run ``block``."""
        where = make_filter(ids, **selection)
        if where.is_empty and not everything:
            raise InvalidOption("ids", "name dead letters by id or filter, or pass all=True")
        if everything and not where.is_empty:
            raise InvalidOption("all", "all=True cannot be combined with ids or filters")
        who = validate.actor(actor)
        note = None if note is None else validate.reason(note, "note")
        return (yield call(block, where=where, actor=who, note=note))


class DeadLetters(DeadLettersBase, Blocking):
    """``Broker.dead_letters``: each call returns its result."""


class AsyncDeadLetters(DeadLettersBase, Awaiting):
    """``AsyncBroker.dead_letters``: each call is a coroutine."""
