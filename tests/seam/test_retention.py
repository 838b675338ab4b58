"""Retention through the seam: a subscription's own archive and dead-letter times, their
bounds, the archive's daily partitions (PostgreSQL) and the bounded trims of rows past
their time, on both dialects."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.seam.support import claim, publish

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.storage.base import DeadFilter, RetentionBounds

DAY = 86400.0


def finish(backend: Any, queue: str, *, dead: bool = False) -> None:
    """One copy of ``queue`` published, claimed and archived (or dead-lettered)."""
    publish(backend, queue)
    (delivery,) = claim(backend, queue, 1)
    lease = Lease.of(delivery)
    settlement = Settlement.dead(lease, "poison") if dead else Settlement.complete(lease)
    backend.message_settle_many(settlements=[settlement])


def archived(backend: Any, queue: str) -> int:
    return len(backend.archive_list(subscription=queue, outcome=None, message_id=None, limit=50))


def dead(backend: Any, queue: str) -> int:
    return len(backend.dead_list(where=DeadFilter(subscription=queue), limit=50, after_id=None))


def test_a_subscription_keeps_its_own_times(backend: Any) -> None:
    for name in ("a", "b"):
        backend.subscription_ensure(name=name)
    assert backend.retention_bounds() == RetentionBounds(None, None, None, None)

    assert backend.retention_set(
        name="a", archive=60, dead=None, change_archive=True, change_dead=False
    )
    assert backend.retention_set(
        name="b", archive=None, dead=30.5, change_archive=False, change_dead=True
    )
    assert backend.retention_set(
        name="a", archive=None, dead=7200, change_archive=False, change_dead=True
    )
    assert not backend.retention_set(
        name="nobody", archive=1, dead=1, change_archive=True, change_dead=True
    )

    assert backend.retention_list(name=None) == [("a", 60.0, 7200.0), ("b", None, 30.5)]
    assert backend.retention_list(name="b") == [("b", None, 30.5)]
    assert backend.retention_bounds() == RetentionBounds(60.0, 60.0, 7200.0, 30.5)
    with backend.begin() as tx:
        tx.retention_set(name="a", archive=None, dead=None, change_archive=True, change_dead=True)
        assert tx.retention_list(name="a") == [("a", None, None)]

    async def listed() -> list[Any]:
        try:
            found: list[Any] = await backend.async_ops.retention_list(name="a")
            return found
        finally:
            await backend.close_async()

    assert asyncio.run(listed()) == [("a", None, None)]


def test_the_longest_time_trims_every_subscription(backend: Any, clock: ManualClock) -> None:
    finish(backend, "old")
    finish(backend, "old", dead=True)
    clock.advance(3 * DAY)
    finish(backend, "new")
    finish(backend, "new", dead=True)

    # PostgreSQL rounds the archive's cutoff down to the day (a day goes whole): 3 days
    # back is past it on both dialects, today is not.
    assert backend.archive_trim(keep=DAY, limit=10) == 1
    assert backend.dead_trim(keep=DAY, limit=10) == 1
    assert (archived(backend, "old"), dead(backend, "old")) == (0, 0)
    assert (archived(backend, "new"), dead(backend, "new")) == (1, 1)
    assert backend.archive_trim(keep=DAY, limit=10) == 0
    assert backend.dead_trim(keep=DAY, limit=10) == 0


def test_a_shorter_time_trims_its_subscription_only(backend: Any, clock: ManualClock) -> None:
    for queue in ("brief", "kept"):
        finish(backend, queue)
        finish(backend, queue, dead=True)
    backend.retention_set(name="brief", archive=60, dead=60, change_archive=True, change_dead=True)
    clock.advance(120)

    assert backend.archive_trim_shorter(keep=DAY, longest=DAY, limit=10) == 1
    assert backend.dead_trim_shorter(keep=DAY, longest=DAY, limit=10) == 1
    assert (archived(backend, "brief"), dead(backend, "brief")) == (0, 0)
    assert (archived(backend, "kept"), dead(backend, "kept")) == (1, 1)
    assert backend.archive_trim_shorter(keep=DAY, longest=DAY, limit=10) == 0


def test_a_trim_is_bounded_by_its_limit(backend: Any, clock: ManualClock) -> None:
    for _ in range(3):
        finish(backend, "jobs")
        finish(backend, "jobs", dead=True)
    clock.advance(3 * DAY)
    assert backend.archive_trim(keep=DAY, limit=2) == 2
    assert backend.dead_trim(keep=DAY, limit=2) == 2
    assert (archived(backend, "jobs"), dead(backend, "jobs")) == (1, 1)


def test_only_a_partitioned_archive_has_days_to_maintain(backend: Any, clock: ManualClock) -> None:
    backend.archive_partitions_maintain(ahead=3, keep=30 * DAY)
    again = backend.archive_partitions_maintain(ahead=3, keep=30 * DAY)
    clock.advance(10 * DAY)
    created, _ = backend.archive_partitions_maintain(ahead=3, keep=30 * DAY)
    assert again == (0, 0)
    if backend.name == "sqlite":
        assert created == 0
    else:
        assert created > 0  # the days ahead of the new now
