"""Flow control by an operator: pause and resume a subscription, cancel running copies.

A pause is the subscription's ``paused`` flag, which the claim itself reads (so it holds for
every worker, survives restarts, and running handlers finish). Cancelling a message
archives its copies that are not running and flags the running ones
(:func:`messages.message_cancel_many`); a worker finds the flag on the copies it runs
(PostgreSQL wakes it with a NOTIFY on the cancel channel), stops the handler and archives
the copy as cancelled (:func:`messages.message_settle_many`, kind ``cancel``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlbroker.core.errors import NotFound
from sqlbroker.storage.operations.admin import audit
from sqlbroker.storage.plan import Plan, atomic, query, reads

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


@atomic
def subscription_pause(
    settings: Settings, *, name: str, paused: bool, actor: str, note: str | None
) -> Plan[None]:
    """Pause (``paused=True``) or resume a subscription and record who did it in the audit
    trail; ``NotFound`` for an unknown name. A resume wakes the subscription's workers."""
    found = yield query("subscription_set_paused", name=name, paused=paused)
    if not found:
        raise NotFound(f"no subscription named {name!r}")
    action = "subscription.pause" if paused else "subscription.resume"
    yield audit(actor, action, {"subscription": name, "note": note})
    if not paused and settings.supports_notify:
        yield query("notify_many", channel=settings.notify_channel, payloads=[name])


@reads
def message_cancel_requested(settings: Settings, *, ids: Sequence[int]) -> Plan[list[int]]:
    """Which of these copies (a worker's running ones) have a cancel request."""
    if not ids:
        return []
    rows = yield query("message_cancel_requested", ids=list(ids))
    return [row[0] for row in rows]
