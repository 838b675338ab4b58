"""Retention: per-subscription times, the archive's daily partitions (PostgreSQL) and the
bounded deletes of archive rows and dead letters past their time (see
:mod:`sqlbroker.features.retention`, which decides what runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlbroker.storage.base import RetentionBounds
from sqlbroker.storage.plan import Plan, changed, changed_count, query, reads

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


def _seconds(value: object) -> float | None:
    """A stored retention, or ``None`` (the default) for NULL or a damaged value."""
    return float(value) if isinstance(value, int | float) and value > 0 else None


def retention_set(
    settings: Settings,
    *,
    name: str,
    archive: float | None,
    dead: float | None,
    change_archive: bool,
    change_dead: bool,
) -> Plan[bool]:
    """Set the subscription's own retentions (``change_*``: which); False if it is unknown."""
    return changed(
        "retention_set",
        name=name,
        archive=archive,
        dead=dead,
        change_archive=change_archive,
        change_dead=change_dead,
    )


@reads
def retention_list(
    settings: Settings, *, name: str | None
) -> Plan[list[tuple[str, float | None, float | None]]]:
    """``(subscription, archive, dead)`` retentions of its own (``None``: the default)."""
    rows = yield query("retention_list", name=name)
    return [(str(row[0]), _seconds(row[1]), _seconds(row[2])) for row in rows]


@reads
def retention_bounds(settings: Settings) -> Plan[RetentionBounds]:
    """The longest and shortest retention a subscription has of its own."""
    (row,) = yield query("retention_bounds")
    return RetentionBounds(*(_seconds(value) for value in row))


def archive_partitions_maintain(
    settings: Settings, *, ahead: int, keep: float
) -> Plan[tuple[int, int]]:
    """PostgreSQL: create the archive's days ``ahead`` and drop those past ``keep``
    seconds; ``(created, dropped)``. SQLite's archive is one table: nothing to do."""
    if not settings.partitioned_archive:
        return 0, 0
    (row,) = yield query("archive_partitions_maintain", ahead=ahead, keep=keep)
    created, dropped = row[0]
    return int(created), int(dropped)


def archive_trim(settings: Settings, *, keep: float, limit: int) -> Plan[int]:
    """At most ``limit`` archive rows past the longest retention in force (``keep``)."""
    return changed_count("archive_trim_before", keep=keep, limit=limit)


def archive_trim_shorter(
    settings: Settings, *, keep: float, longest: float, limit: int
) -> Plan[int]:
    """At most ``limit`` archive rows of subscriptions with a shorter retention."""
    return changed_count("archive_trim_shorter", keep=keep, longest=longest, limit=limit)


def dead_trim(settings: Settings, *, keep: float, limit: int) -> Plan[int]:
    """At most ``limit`` dead letters past the longest retention in force (``keep``)."""
    return changed_count("dead_trim_before", keep=keep, limit=limit)


def dead_trim_shorter(settings: Settings, *, keep: float, longest: float, limit: int) -> Plan[int]:
    """At most ``limit`` dead letters of subscriptions with a shorter retention."""
    return changed_count("dead_trim_shorter", keep=keep, longest=longest, limit=limit)
