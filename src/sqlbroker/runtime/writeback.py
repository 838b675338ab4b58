"""Batched write-back of outcomes: completes, retries, dead-letters and cancels.

Outcomes (settlements) accumulate and are written, mixed, by one ``message_settle_many``
per ``max_items`` (one statement on PostgreSQL) when ``max_items`` are waiting or
``max_delay`` seconds have passed since the first one. An outcome that follows
``quiet`` seconds without any is written at once when no other claimed copy is open: at a
low rate the window would gather nothing but delay, and its write (a durable commit) would
then overlap the next message's publish and claim on the same disk and cores; with others
open (a slow drain: each claim's round trip is a quiet spell) more outcomes are coming.
A failed write keeps its items and is tried again with backoff; :meth:`WriteBack.drain`
empties the buffer on shutdown, after which the buffer takes nothing more. A delivery
whose lease was lost meanwhile is reported, not retried: another consumer owns it now.

The buffer is bounded: outcomes buffered or being written, plus the copies the pumps have
claimed and not settled yet (each ends as at most one outcome), stay within ``backlog``.
A pump claims only into :meth:`WriteBack.room`, so a slow database stops the claims
instead of growing the buffer; each flush frees room as its sub-batches are written.

Outcomes may be added from any thread (a manual ``ack`` from wherever the handler handed
its message); flushes run on the event loop one at a time, so the final drain also waits
for — and takes back what failed of — a flush the write-back task has in flight. A write
is the backend's coroutine (:attr:`Backend.async_ops`): on PostgreSQL it runs on the
loop's own connections, as the claims do, with no thread in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.settlements import Settlement

Settle = Callable[..., Awaitable[list[int]]]
"""How a sub-batch is written: the backend's ``async_ops.message_settle_many`` (on
PostgreSQL the worker's loop's async connections; on SQLite the backend's own thread)."""

log = logging.getLogger("sqlbroker.runtime")
MAX_DOUBLINGS = 30
DEFAULT_WRITE_BATCH = 500
"""Outcomes written per database call."""
DEFAULT_WRITE_BACKLOG = 5000
"""Outcomes and unsettled claims a worker holds at most."""


def retry_pause(failures: int, *, first: float, cap: float) -> float:
    """The pause after ``failures`` consecutive failures: ``first`` doubled per failure, at
    most ``cap``. The exponent is bounded: a long outage must not overflow a float."""
    return min(cap, first * 2.0 ** min(max(failures - 1, 0), MAX_DOUBLINGS))


@dataclass
class FlushReport:
    """What one write did, for the pump's bookkeeping and hooks."""

    done: list[Settlement] = field(default_factory=list)
    lost: list[Settlement] = field(default_factory=list)


class WriteBackClosed(SqlbrokerError):
    """An outcome came after the worker's final write-back: it cannot be written."""


class WriteBack:
    """Create it on the event loop that runs :meth:`run` and :meth:`drain`."""

    def __init__(
        self,
        settle: Settle,
        *,
        on_flushed: Callable[[FlushReport], None],
        max_items: int = 500,
        backlog: int = 5000,
        outstanding: Callable[[], int] = lambda: 0,
        max_delay: float = 0.01,
        quiet: float = 0.002,
    ) -> None:
        """``outstanding`` counts the copies claimed and not settled yet (the pumps')."""
        self._settle = settle
        self._on_flushed = on_flushed
        self._max_items = max_items
        self._backlog = backlog
        self._outstanding = outstanding
        self._writing = 0  # outcomes taken by the flush in progress, not written yet
        self.roomy = asyncio.Event()
        """Set when a write frees room (:meth:`room`)."""
        self._max_delay = max_delay
        self._quiet = quiet
        self._last_added = -math.inf
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._mutex = threading.Lock()  # guards _items and _closed against other threads
        self._items: list[Settlement] = []
        self._closed = False
        self._flushing = asyncio.Lock()
        self._has_items = asyncio.Event()
        self._due = asyncio.Event()  # write without waiting for the window

    def __len__(self) -> int:
        """Outcomes held: buffered, or taken by the flush in progress."""
        return len(self._items) + self._writing

    def room(self) -> int:
        """How many more copies may be claimed without the held outcomes and the
        unsettled claims passing ``backlog``."""
        return self._backlog - len(self) - self._outstanding()

    def add(self, outcome: Settlement) -> None:
        """Buffer ``outcome``; safe from any thread. Raises :class:`WriteBackClosed` once
        the final drain began: nothing would write it, and the caller must know."""
        now = time.monotonic()
        with self._mutex:
            if self._closed:
                held = outcome.delivery
                named = f"message {held.message_id}" if held else f"copy {outcome.lease.id}"
                raise WriteBackClosed(
                    f"the worker has stopped; {named} will be delivered again when its lease"
                    " expires"
                )
            self._items.append(outcome)
            count = len(self._items)
            # After a quiet spell an outcome is written at once, unless other claimed copies
            # are still open (this one's delivery counts until its slot is freed): a drain
            # whose claims come back slowly has the rest of the batch coming, and a write
            # per claim would cost a statement per batch (the worker's CPU and the
            # server's), where the window gathers several batches.
            due = count >= self._max_items or (
                count == 1 and now - self._last_added >= self._quiet and self._outstanding() <= 1
            )
            self._last_added = now
        if threading.get_ident() == self._loop_thread:
            self._wake(due)
        else:
            # A closed loop: the worker closed this buffer before it ended, or add raised.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake, due)

    def hurry(self) -> None:
        """Write what is buffered without waiting for the window (on the loop): no more
        outcomes are coming soon (a pump claimed all there was and settled it)."""
        if self._items:
            self._due.set()

    def _wake(self, due: bool) -> None:
        self._has_items.set()
        if due:
            self._due.set()

    def close(self) -> None:
        """Take no more outcomes (:meth:`add` raises from now on)."""
        with self._mutex:
            self._closed = True

    async def run(self, stop: asyncio.Event) -> None:
        """Flush until ``stop`` is set (the final drain is separate)."""
        failures = 0
        while not stop.is_set():
            await wait_any(self._has_items, stop)
            if stop.is_set():
                break
            if not self._due.is_set():
                await wait_any(self._due, stop, timeout=self._max_delay)
            if await self.flush():
                failures = 0
            else:
                failures += 1
                await wait_any(stop, timeout=retry_pause(failures, first=0.1, cap=5.0))

    async def drain(self, *, timeout: float) -> bool:
        """Close the buffer and write everything in it, also what a flush in flight fails
        to write; give up after ``timeout`` seconds."""
        self.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = 0.05
        while True:
            # Waits for a flush the write-back task has in flight: its failures come back.
            written = await self.flush()
            if not self._items:
                return True
            if written:
                continue
            if loop.time() + pause > deadline:
                log.error(
                    "could not write back %d outcomes before shutdown; their leases will"
                    " expire and the messages will be delivered again",
                    len(self._items),
                )
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def flush(self) -> bool:
        """One write of everything buffered; ``False`` when the database failed.

        The outcomes are written as settlements, mixed, ``max_items`` per database call;
        a call that fails keeps its outcomes (and those not yet tried) for the next flush.
        A second outcome for one copy (a stale delivery's and its re-claim's) waits for the
        next flush: a write reports valid leases by copy, so one call must hold each copy once.
        One flush runs at a time; a second waits for the first to end.
        """
        async with self._flushing:
            return await self._flush()

    async def _flush(self) -> bool:
        with self._mutex:
            batch, self._items = self._items, []
            self._writing = len(batch)
        self._has_items.clear()
        self._due.clear()
        report = FlushReport()
        seen: set[int] = set()
        now: list[Settlement] = []
        later: list[Settlement] = []
        for outcome in batch:
            (later if outcome.lease.id in seen else now).append(outcome)
            seen.add(outcome.lease.id)
        written = 0  # now[:written] are written; the rest go back (a failure, a cancel)
        try:
            while written < len(now):
                chunk = now[written : written + self._max_items]
                try:
                    # The ids whose lease was still valid.
                    ids = set(await self._settle(settlements=chunk))
                except SqlbrokerError as error:
                    log.warning(
                        "write-back of %d outcomes failed, will retry: %s",
                        len(now) - written,
                        error,
                    )
                    break
                for outcome in chunk:
                    (report.done if outcome.lease.id in ids else report.lost).append(outcome)
                written += len(chunk)
                with self._mutex:
                    self._writing -= len(chunk)
                self.roomy.set()
        finally:
            kept = now[written:]
            with self._mutex:
                self._items[:0] = kept + later
                self._writing = 0
        if kept or later:
            self._has_items.set()
        if report.done or report.lost:
            self._on_flushed(report)
        return not kept


async def wait_any(
    *events: asyncio.Event,
    timeout: float | None = None,
    futures: Sequence[asyncio.Future[Any]] = (),
) -> None:
    """Return when any event is set or future done, or after ``timeout`` seconds.

    The ``futures`` are left running; only the internal event waiters are cancelled.
    """
    if any(event.is_set() for event in events) or any(f.done() for f in futures):
        return  # no waiter tasks for what is already there: the hot loops' usual case
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(
            [*waiters, *futures], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiter in waiters:
            waiter.cancel()
