"""The write-back under a slow database: while another connection holds a lock every
settlement needs, a real worker's held outcomes and unsettled claims stay within its
``write_backlog`` (the claims pause instead of the buffer growing), each write takes at
most ``write_batch`` settlements, and once the lock is released everything completes."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import sqlbroker
from runtime.support import run_until_idle
from sqlbroker.runtime.writeback import WriteBack

LIMIT = 120.0
BATCH = 10
BACKLOG = 40
HOLD = 2.0
"""Seconds the other connection holds its lock."""


def _locker(request: pytest.FixtureRequest, backend_url: str) -> Callable[[], Any]:
    """A context manager that holds, on a connection of its own, a lock every settlement
    needs: SQLite's write lock (``BEGIN IMMEDIATE``), PostgreSQL's SHARE lock on the
    archive (claims go on, completes wait)."""
    if backend_url.startswith("sqlite"):
        path = backend_url.removeprefix("sqlite:///")

        @contextmanager
        def sqlite_lock() -> Iterator[None]:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield
                conn.execute("ROLLBACK")
            finally:
                conn.close()

        return sqlite_lock
    # As the owner: the runtime login of the test database may not lock tables.
    database = urlsplit(backend_url).path.lstrip("/")
    owner_url = request.getfixturevalue("pg_server").url(database)

    @contextmanager
    def pg_lock() -> Iterator[None]:
        with psycopg.connect(owner_url) as conn:
            conn.execute("LOCK TABLE sqlbroker_archive IN SHARE MODE")
            yield
            conn.rollback()

    return pg_lock


def test_a_slow_database_pauses_the_claims_and_the_backlog_stays_bounded(
    broker: sqlbroker.Broker,
    backend_url: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock = _locker(request, backend_url)
    held_sizes: list[int] = []
    write_sizes: list[int] = []
    locked, released = threading.Event(), threading.Event()

    real_add = WriteBack.add

    def watched_add(self: WriteBack, outcome: Any) -> None:
        real_add(self, outcome)
        held_sizes.append(len(self))

    monkeypatch.setattr(WriteBack, "add", watched_add)
    real_settle = broker.backend.async_ops.message_settle_many

    async def watched_settle(**kwargs: Any) -> Any:
        write_sizes.append(len(kwargs["settlements"]))
        return await real_settle(**kwargs)

    monkeypatch.setattr(broker.backend.async_ops, "message_settle_many", watched_settle)

    def hold_the_lock() -> None:
        with lock():
            locked.set()
            released.wait(HOLD)

    holder = threading.Thread(target=hold_the_lock)

    @broker.subscriber(queue="jobs", concurrency=4, prefetch=2 * BACKLOG)
    async def handle(msg: sqlbroker.Message) -> None:
        if not holder.is_alive() and not locked.is_set():
            # The first handler: the other connection takes its lock now, while the
            # claim's batch is still to be handled and written back.
            holder.start()
            assert locked.wait(LIMIT)

    ids = broker.send_many("jobs", list(range(300)))
    try:
        broker.run_until_idle(
            timeout=LIMIT,
            install_signal_handlers=False,
            write_batch=BATCH,
            write_backlog=BACKLOG,
        )
    finally:
        released.set()
        if holder.is_alive():
            holder.join(LIMIT)

    assert locked.is_set(), "the lock was never taken"
    # Nothing lost: every message was completed once, nothing is left or dead.
    monkeypatch.undo()
    archived = broker.archive("jobs", limit=1000)
    assert sorted(row.message_id for row in archived) == sorted(ids)
    assert all(row.outcome == sqlbroker.Outcome.COMPLETED for row in archived)
    assert broker.pending("jobs") == []
    assert broker.dead_letters.list() == []
    # Bounded: the outcomes held never passed the backlog, though the lock let them pile
    # up past one write; each write took at most one sub-batch.
    assert max(held_sizes) <= BACKLOG, max(held_sizes)
    assert max(held_sizes) > BATCH, max(held_sizes)
    assert max(write_sizes) == BATCH, write_sizes
    assert sum(write_sizes) >= len(ids)


@pytest.mark.parametrize(
    ("option", "value"), [("write_batch", 0), ("write_backlog", 0), ("write_batch", "10")]
)
def test_write_back_options_are_checked(broker: sqlbroker.Broker, option: str, value: Any) -> None:
    @broker.subscriber(queue="jobs")
    async def handle(msg: sqlbroker.Message) -> None:
        pass

    with pytest.raises(sqlbroker.InvalidOption, match=option):
        broker.worker(**{option: value})


def test_a_pump_waiting_for_room_wakes_when_another_subscription_commits_its_own(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog is shared by the worker's subscriptions. Here "ledger" holds all of it
    with two claims that its handlers then complete in their own transactions — which frees
    the room without any write-back — while "mail" waits for room. It must wake then, not
    wait for a write that never comes (the worker never went idle)."""
    waited_for_room = threading.Event()
    real_room = WriteBack.room

    def watched_room(self: WriteBack) -> int:
        room = real_room(self)
        if room <= 0:
            waited_for_room.set()
        return room

    monkeypatch.setattr(WriteBack, "room", watched_room)
    started: list[int] = []
    both_started = threading.Event()

    @broker.subscriber(queue="ledger", concurrency=2, prefetch=0)
    def ledger(msg: sqlbroker.Message) -> None:
        started.append(msg.payload)
        if len(started) == 2:
            both_started.set()
        assert both_started.wait(LIMIT)
        if msg.payload == 0:
            broker.send("mail", "hello")  # wakes the other pump, which finds no room
        assert waited_for_room.wait(LIMIT)
        with msg.transaction():
            pass

    mailed: list[str] = []

    @broker.subscriber(queue="mail")
    def mail(msg: sqlbroker.Message) -> None:
        mailed.append(msg.payload)

    broker.send_many("ledger", [0, 1])
    run_until_idle(broker, install_signal_handlers=False, write_backlog=2)

    assert sorted(started) == [0, 1]
    assert mailed == ["hello"]
    assert broker.pending("ledger") == []
    assert broker.pending("mail") == []
