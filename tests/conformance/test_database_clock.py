"""``Broker(clock=DatabaseClock())``, the production clock spelled out. Its ``now()`` is
``None`` ("the database decides"), which every layer must pass on rather than use as a
time (a refactor once did, and only mypy noticed). Under it a publish, a claim with a
lease, a completion and a retry with a delay record the database's times: PostgreSQL's
``statement_timestamp()``; on SQLite, which has no server, the clock of the process, as
the backend reads it. Each lies between the database's own readings around the call."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlbroker
from helpers import TIME_TOLERANCE


def _within(found: datetime | None, earliest: datetime, latest: datetime) -> None:
    assert found is not None
    assert earliest - TIME_TOLERANCE <= found <= latest + TIME_TOLERANCE, (
        f"{found.isoformat()} is not within the database's {earliest.isoformat()}"
        f" .. {latest.isoformat()}"
    )


def test_the_database_clock_times_publish_claim_complete_and_retry(backend_url: str) -> None:
    clock = sqlbroker.DatabaseClock()
    lease, delay = timedelta(seconds=30), timedelta(seconds=60)
    with sqlbroker.Broker(backend_url, migrate=True, clock=clock) as broker:
        database = broker.backend  # its now(): the database's clock under DatabaseClock
        start = database.now()
        ids = broker.send_many("jobs", ["done", "again"])
        published = database.now()
        deliveries = broker.claim("jobs", limit=2, lease=lease)
        claimed = database.now()
        done, again = sorted(deliveries, key=lambda delivery: delivery.payload != "done")
        broker.complete(done)
        completed = database.now()
        broker.retry(again, after=delay)
        retried = database.now()
        (archived,) = broker.archive("jobs")
        (pending,) = broker.pending("jobs")

    assert [d.message_id for d in (done, again)] == ids
    for delivery in deliveries:
        _within(delivery.enqueued_at, start, published)
        _within(delivery.available_at, start, published)
        _within(delivery.lease_expires_at, published + lease, claimed + lease)
    assert archived.message_id == done.message_id
    _within(archived.enqueued_at, start, published)
    _within(archived.first_started_at, published, claimed)
    _within(archived.finished_at, claimed, completed)
    assert (pending.message_id, pending.state) == (again.message_id, sqlbroker.State.SCHEDULED)
    _within(pending.available_at, completed + delay, retried + delay)
