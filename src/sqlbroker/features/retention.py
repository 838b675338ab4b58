"""Retention: how long archive rows and dead letters are kept, and the reaper's share of
removing them (docs/reliability.md, "Retention").

Every subscription keeps its finished copies for ``archive`` seconds and its dead letters
for ``dead`` seconds: its own times when set, the broker's defaults otherwise (7 and 30
days). Unrouted publishes, which have no subscription, follow the archive default; rows of
a deleted subscription follow the longest retention in force. On PostgreSQL the archive
is partitioned by day: whole days past the longest retention are dropped, and shorter
retentions are applied by deleting rows, in bounded batches, like everything on SQLite.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlbroker.core import validate
from sqlbroker.core.errors import StorageError
from sqlbroker.features.faces import Plan, call

log = logging.getLogger("sqlbroker.retention")

DAY = 86_400.0
DEFAULT_ARCHIVE_RETENTION = 7 * DAY
"""A week: long enough to look into last weekend's incident or re-run a weekly export,
short enough that a busy queue's archive stays a small multiple of a day's traffic."""
DEFAULT_DEAD_RETENTION = 30 * DAY
"""A month: a dead letter waits for a person (to read, fix and replay); a month covers a
holiday and a monthly review, and dead letters are far fewer than archive rows."""
MAX_RETENTION = 36_500 * DAY
"""A hundred years: what the schema accepts (and finite, so the reaper's arithmetic is)."""
PARTITIONS_AHEAD = 3
"""Days of archive partitions kept ready ahead of today (PostgreSQL), so that a weekend
without a reaper still finds its days."""


@dataclass(frozen=True, slots=True)
class RetentionDefaults:
    """The broker's defaults, in seconds."""

    archive: float = DEFAULT_ARCHIVE_RETENTION
    dead: float = DEFAULT_DEAD_RETENTION

    @classmethod
    def checked(cls, *, archive: object, dead: object) -> RetentionDefaults:
        return cls(
            archive=retention_seconds(archive, "archive_retention"),
            dead=retention_seconds(dead, "dead_retention"),
        )


def retention_seconds(value: object, field: str) -> float:
    """A retention: seconds or a ``timedelta``, greater than zero, at most a hundred years."""
    return validate.seconds(value, field, maximum=MAX_RETENTION, allow_zero=False)


def _has_shorter(default: float, shortest: float | None, longest: float) -> bool:
    """Does any row follow a retention shorter than the longest? The default's rows
    (unrouted ones at least) when the default is shorter; else a subscription's own."""
    return default < longest or (shortest is not None and shortest < longest)


def retain(defaults: RetentionDefaults, *, limit: int) -> Plan[dict[str, int]]:
    """The reaper's retention pass. Rows past the longest retention in force go first
    (PostgreSQL: whole days are dropped, then what no day took); rows under a shorter
    retention then go by subscription, only when such a retention exists. At most ``limit``
    archive rows and ``limit`` dead letters are deleted per pass."""
    bounds = yield call("retention_bounds")
    archive_longest = max(defaults.archive, bounds.archive_longest or 0.0)
    dead_longest = max(defaults.dead, bounds.dead_longest or 0.0)
    try:
        created, dropped = yield call(
            "archive_partitions_maintain", ahead=PARTITIONS_AHEAD, keep=archive_longest
        )
    except StorageError as error:
        # Days are an optimisation: without them rows go to the default partition, and the
        # row deletes below still apply every retention. Say why, and carry on.
        log.warning("archive partitions not maintained: %s", error)
        created = dropped = 0
    if created or dropped:
        log.info(
            "archive partitions: %d day(s) created, %d dropped",
            created,
            dropped,
            extra={"partitions_created": created, "partitions_dropped": dropped},
        )
    trimmed: dict[str, int] = {}
    for kind, default, shortest, longest in (
        ("archive", defaults.archive, bounds.archive_shortest, archive_longest),
        ("dead", defaults.dead, bounds.dead_shortest, dead_longest),
    ):
        count: int = yield call(f"{kind}_trim", keep=longest, limit=limit)
        if count < limit and _has_shorter(default, shortest, longest):
            count += yield call(
                f"{kind}_trim_shorter", keep=default, longest=longest, limit=limit - count
            )
        trimmed[f"{kind}_trimmed"] = count
    return trimmed
