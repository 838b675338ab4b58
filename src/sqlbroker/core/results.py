"""Stored results: what became of each subscription's copy of a message.

A handler's return value is stored with its copy when it completes (a ``None`` stores
nothing); a copy that failed for good keeps its error in the dead letters. :func:`read_result`
turns every trace a message left (the hot table, the stored values, the dead letters, the
archive) into the :class:`Result` of one copy — the one rule of which trace wins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlbroker.core.errors import InvalidOption, NotFound
from sqlbroker.core.message import ErrorInfo
from sqlbroker.core.serde import JSON_CONTENT_TYPE, decode_payload


@dataclass(frozen=True, slots=True)
class Result:
    """The finished outcome of one subscription's copy of a message.

    - ``outcome``: ``"completed"``, ``"dead"`` (dead-lettered), ``"expired"`` or
      ``"cancelled"``;
    - ``value``: what the handler returned (decoded JSON) for a completed copy, else ``None``
      (also when the handler returned ``None``);
    - ``error``: for a dead-lettered copy, the error that killed it (type, message,
      traceback; the type is ``sqlbroker.DeadLetter`` when none was given) — else ``None``;
    - ``reason``: why a dead-lettered copy died (``attempts spent``, a ``Reject`` reason, …);
    - ``finished_at``: when the copy finished, by the database's clock.
    """

    message_id: str
    subscription: str
    outcome: str
    value: Any
    error: ErrorInfo | None
    reason: str | None
    finished_at: datetime

    @property
    def ok(self) -> bool:
        """Whether the copy completed (its handler returned)."""
        return self.outcome == "completed"


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """One trace of a copy as storage reads it: ``kind`` is ``"pending"`` (still in the hot
    table), ``"value"`` (a stored return value), ``"dead"``, or an archive outcome
    (``"completed"``, ``"expired"``, ``"cancelled"``, ``"unrouted"``)."""

    subscription: str | None
    kind: str
    value: bytes | None = None
    reason: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    finished_at: datetime | None = None


_RANK = {"value": 3, "dead": 2}
"""Among the finished traces of one copy the latest wins; at the same time a stored value
beats the archive row written with it."""


def result_subscription(
    message_id: str, records: Sequence[ResultRecord], subscription: str | None
) -> str:
    """The subscription whose copy is meant: ``subscription``, or the only one the message
    has. Raises ``NotFound`` for a message without copies (unknown, unrouted, or every trace
    of it trimmed) and ``InvalidOption`` naming the subscriptions when there are several."""
    copies = sorted({r.subscription for r in records if r.subscription is not None})
    if subscription is not None:
        if subscription in copies:
            return subscription
        others = f" (it has copies in: {', '.join(copies)})" if copies else ""
        raise NotFound(f"message {message_id} has no copy in subscription {subscription}{others}")
    if not copies:
        if records:
            raise NotFound(f"message {message_id} was unrouted: no subscription got a copy")
        raise NotFound(
            f"message {message_id} is unknown: never published, or finished and its records"
            " trimmed (or, with archive_completed=False, completed without a value)"
        )
    if len(copies) > 1:
        shown = ", ".join(copies[:20]) + (
            f" and {len(copies) - 20} more" if len(copies) > 20 else ""
        )
        raise InvalidOption(
            "subscription",
            f"message {message_id} has a copy in each of {len(copies)} subscriptions"
            f" ({shown}): pass subscription= to say whose result",
        )
    return copies[0]


def read_result(
    message_id: str,
    records: Sequence[ResultRecord],
    subscription: str,
    *,
    values_kept_since: Callable[[], datetime] | None = None,
) -> Result | None:
    """The result of ``subscription``'s copy, or ``None`` while it is not finished.

    ``values_kept_since()`` is the oldest finish whose value is still kept (now minus the
    retention): a completion older than that whose only trace is its archive row may have
    had a value, trimmed since, so it raises ``NotFound`` rather than claim ``None``."""
    mine = [r for r in records if r.subscription == subscription]
    if any(r.kind == "pending" for r in mine):
        return None
    finished = [r for r in mine if r.finished_at is not None]
    if not finished:
        return None
    best = max(finished, key=lambda r: (r.finished_at, _RANK.get(r.kind, 1)))
    assert best.finished_at is not None
    if best.kind == "value":
        value = None if best.value is None else decode_payload(bytes(best.value), JSON_CONTENT_TYPE)
        return Result(message_id, subscription, "completed", value, None, None, best.finished_at)
    if best.kind == "dead":
        error = ErrorInfo(
            type=best.error_type or "sqlbroker.DeadLetter",
            message=best.error_message or best.reason or "",
            traceback=best.traceback,
        )
        return Result(message_id, subscription, "dead", None, error, best.reason, best.finished_at)
    if (
        best.kind == "completed"
        and values_kept_since is not None
        and best.finished_at < values_kept_since()
    ):
        raise NotFound(
            f"the result of message {message_id} in {subscription} is no longer kept: it"
            f" completed at {best.finished_at.isoformat()}, before the result retention"
            " (result_ttl)"
        )
    return Result(message_id, subscription, best.kind, None, None, None, best.finished_at)
