"""Every delivery a handler started gets exactly one outcome, whatever the handler does:
times out inside its transaction, raises ``CancelledError`` or another ``BaseException``;
and the bookkeeping of one delivery's outcome never touches a later claim of its copy."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import sqlbroker
from runtime.support import assert_all_completed_once
from sqlbroker.core.message import Delivery
from sqlbroker.runtime.events import WorkerObserver
from sqlbroker.runtime.handling import HandlerTimeout

LIMIT = 20.0
"""A bound against a hang: a run that reaches it has left a message unsettled."""


def _app(backend_url: str) -> Any:
    if backend_url.startswith("sqlite"):
        return sqlite3.connect(backend_url.removeprefix("sqlite:///"), isolation_level=None)
    import psycopg

    return psycopg.connect(backend_url, autocommit=True)


@pytest.fixture
def app_rows(broker: sqlbroker.Broker, backend_url: str) -> Callable[[], list[tuple[Any, ...]]]:
    broker.stats()  # the schema first: SQLite creates it on first use
    conn = _app(backend_url)
    try:
        conn.execute("CREATE TABLE app_effects (message_id text, attempt integer)")
    finally:
        conn.close()

    def rows() -> list[tuple[Any, ...]]:
        conn = _app(backend_url)
        try:
            return [tuple(r) for r in conn.execute("SELECT message_id, attempt FROM app_effects")]
        finally:
            conn.close()

    return rows


class _Timeouts(WorkerObserver):
    """Sets ``event`` when a handler is given up for its timeout."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def handler_finished(
        self, delivery: Delivery, *, seconds: float, error: BaseException | None
    ) -> None:
        if isinstance(error, HandlerTimeout):
            self.event.set()


@pytest.mark.parametrize("late", ["rollback", "commit", "hang"])
def test_a_sync_handler_timing_out_inside_its_transaction_still_gets_an_outcome(
    broker: sqlbroker.Broker,
    backend_url: str,
    app_rows: Callable[[], list[tuple[Any, ...]]],
    late: str,
) -> None:
    """The first attempt is given up for its timeout while its thread is inside
    ``msg.transaction()``. The thread then rolls back, commits, or hangs on. The message
    must still end completed once, with the one effect of the attempt that completed it —
    not stay leased forever with its slot taken."""
    if late == "hang" and backend_url.startswith("sqlite"):
        pytest.skip("on SQLite an open write transaction holds the write lock for everyone")
    timeouts = _Timeouts()
    broker.add_observer(timeouts)
    release = threading.Event()
    abandoned_done = threading.Event()
    mark = "?" if backend_url.startswith("sqlite") else "%s"
    insert = f"INSERT INTO app_effects VALUES ({mark}, {mark})"

    @broker.subscriber(queue="jobs", timeout=0.2, retry=sqlbroker.RetryPolicy(base=0.01, cap=0.01))
    def handle(msg: sqlbroker.Message) -> None:
        try:
            with msg.transaction() as conn:
                conn.execute(insert, (msg.id, msg.attempt))
                if msg.attempt == 1:
                    assert timeouts.event.wait(LIMIT)
                    if late == "rollback":
                        raise RuntimeError("given up, then failed")
                    if late == "hang":
                        release.wait(LIMIT)
        finally:
            if msg.attempt == 1:
                abandoned_done.set()

    message_id = broker.send("jobs", "work")
    try:
        broker.run_until_idle(timeout=LIMIT)
    finally:
        release.set()
    assert abandoned_done.wait(LIMIT)
    (archived,) = assert_all_completed_once(broker, "jobs", [message_id]).values()
    assert app_rows() == [(message_id, archived.attempts)]
    if late != "commit":
        # Retried while the given-up thread was still inside its transaction.
        assert archived.attempts == 2


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("async", asyncio.CancelledError),
        ("async", SystemExit),
        ("async", KeyboardInterrupt),
        ("sync", SystemExit),
        ("sync", KeyboardInterrupt),
    ],
)
def test_a_handler_raising_a_base_exception_fails_like_any_error(
    broker: sqlbroker.Broker, kind: str, error: type[BaseException]
) -> None:
    """A ``CancelledError`` the handler raises itself is not the worker's cancellation:
    it must not end the handler slot silently; ``SystemExit`` or ``KeyboardInterrupt``
    from a handler must not crash the worker with nothing written. Each is a handler
    failure for the retry policy (by default only ``Exception`` is retried)."""
    handled: list[Any] = []

    def work(msg: sqlbroker.Message) -> None:
        if msg.payload == "bad":
            raise error("from the handler")
        handled.append(msg.payload)

    options: dict[str, Any] = {"queue": "jobs", "concurrency": 1, "prefetch": 0}
    if kind == "async":

        @broker.subscriber(**options)
        async def handle_async(msg: sqlbroker.Message) -> None:
            await asyncio.sleep(0)
            work(msg)

    else:

        @broker.subscriber(**options)
        def handle_sync(msg: sqlbroker.Message) -> None:
            work(msg)

    bad = broker.send("jobs", "bad", priority=sqlbroker.URGENT)
    good = broker.send_many("jobs", [1, 2, 3])
    broker.run_until_idle(timeout=LIMIT)

    (dead,) = broker.dead_letters.list(subscription="jobs")
    assert dead.message_id == bad
    assert dead.attempts == 1
    assert (dead.error_type or "").endswith(error.__name__)
    assert dead.reason == f"error not in retry_on: {error.__name__}"
    assert sorted(handled) == [1, 2, 3]
    assert {row.message_id for row in broker.archive("jobs")} == set(good)
    assert broker.pending("jobs") == []


def test_an_outcome_written_late_does_not_drop_the_lease_of_its_copys_next_claim(
    broker: sqlbroker.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Message A snoozes with ``Retry(after=0)``, B is rejected, in one write-back: both
    commit, and while the write-back's call has not returned yet the same worker claims
    A again. Reporting the first outcome must not take the new claim out of the lease
    keeper: its lease has to be extended for as long as its handler runs, or it expires
    and A runs twice at once."""
    arrived: list[str] = []
    both_arrived = asyncio.Event()
    reclaimed = threading.Event()
    dead_written = threading.Event()
    overlapped = threading.Event()
    calls: list[str] = []
    running: list[str] = []
    backend = broker.backend
    real_settle_many = backend.async_ops.message_settle_many

    async def settle_many(**kwargs: Any) -> Any:
        try:
            return await real_settle_many(**kwargs)
        finally:
            if not dead_written.is_set() and any(s.kind == "dead" for s in kwargs["settlements"]):
                # Holds the flush's report after A's retry committed until A was claimed
                # again (waited for off the loop, which claims A).
                await asyncio.to_thread(reclaimed.wait, LIMIT)
                dead_written.set()

    monkeypatch.setattr(backend.async_ops, "message_settle_many", settle_many)

    def lease_kept_or_lost(message_id: str) -> None:
        """Return after two extensions of A's lease once the dead-letter write (and so
        the report of A's first outcome) is done, or as soon as A runs again in parallel."""
        assert dead_written.wait(LIMIT)
        seen: Any = None
        extensions = 0
        deadline = time.monotonic() + LIMIT
        while extensions < 2 and not overlapped.is_set():
            assert time.monotonic() < deadline, "A's lease was neither extended nor lost"
            row = next(p for p in broker.pending("jobs") if p.message_id == message_id)
            expires = row.lease_expires_at
            if seen is not None and expires is not None and expires > seen:
                extensions += 1
            seen = expires if expires is not None else seen
            time.sleep(0.05)

    @broker.subscriber(queue="jobs", concurrency=2, prefetch=0, lease=1.0)
    async def handle(msg: sqlbroker.Message) -> None:
        calls.append(msg.payload)
        if msg.payload in running:
            overlapped.set()
        running.append(msg.payload)
        try:
            if len(calls) <= 2:
                arrived.append(msg.payload)
                if len(arrived) == 2:
                    both_arrived.set()
                await both_arrived.wait()  # both settle in one loop turn: one flush
                if msg.payload == "A":
                    raise sqlbroker.Retry(after=0)
                raise sqlbroker.Reject("not wanted")
            if msg.payload == "A" and calls.count("A") == 2:
                reclaimed.set()
                await asyncio.to_thread(lease_kept_or_lost, msg.id)
        finally:
            running.remove(msg.payload)

    first = broker.send("jobs", "A")
    broker.send("jobs", "B")
    broker.run_until_idle(timeout=LIMIT, reap_interval=0.2)

    assert not overlapped.is_set(), "A ran twice at once: its new lease was not kept"
    assert calls.count("A") == 2, calls
    assert [row.message_id for row in broker.archive("jobs")] == [first]
    (dead,) = broker.dead_letters.list(subscription="jobs")
    assert dead.reason == "not wanted"
