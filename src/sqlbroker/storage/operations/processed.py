"""Processed keys: consumer-side idempotency (see :mod:`sqlbroker.features.processed`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlbroker.storage.plan import Plan, changed, changed_count, query

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


def reserve(
    settings: Settings, *, scope: str, key: str, token: str, lease: float, window: float
) -> Plan[str]:
    """Reserve ``key`` for ``lease`` seconds under ``token``: ``"reserved"`` when it was
    free (never seen, expired, or its holder's lease ran out), ``"done"`` when it was
    confirmed within its window, ``"busy"`` while another holder's lease runs."""
    taken = yield query(
        "processed_reserve", scope=scope, key=key, token=token, lease=lease, window=window
    )
    if taken:
        return "reserved"
    row = yield query("processed_get", scope=scope, key=key)
    # The holder may have let go between the two statements: call it busy, and the
    # caller's retry finds it free.
    return "done" if row and row[0][0] == "done" else "busy"


def confirm(settings: Settings, *, scope: str, key: str, token: str, window: float) -> Plan[bool]:
    """Mark our reservation done, kept ``window`` seconds; False if it is no longer ours."""
    return changed("processed_confirm", scope=scope, key=key, token=token, window=window)


def extend(settings: Settings, *, scope: str, key: str, token: str, lease: float) -> Plan[bool]:
    """Push our reservation's lease to now + ``lease``; False if it is no longer ours."""
    return changed("processed_extend", scope=scope, key=key, token=token, lease=lease)


def release(settings: Settings, *, scope: str, key: str, token: str) -> Plan[bool]:
    """Give up our reservation (the effect failed): the next attempt may take the key."""
    return changed("processed_release", scope=scope, key=key, token=token)


def forget(settings: Settings, *, scope: str, key: str) -> Plan[bool]:
    """Delete the key whatever its state (an operator's undo)."""
    return changed("processed_forget", scope=scope, key=key)


def trim(settings: Settings, *, limit: int) -> Plan[int]:
    """Delete up to ``limit`` keys past their window; return how many."""
    return changed_count("processed_trim", limit=limit)
