"""A pump's fetch: claim while there are free slots (plus a prefetch sized from the
handlers' pace), sleep until a hint or a jittered poll, back off after failed claims."""

from __future__ import annotations

import asyncio
import logging
import random

from sqlbroker.core import validate
from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.flow import Claimed
from sqlbroker.runtime.holding import Holding, _resolve
from sqlbroker.runtime.writeback import retry_pause, wait_any

log = logging.getLogger("sqlbroker.runtime")
PREFETCH_WAIT = 0.05
MAX_AUTO_PREFETCH = 100
CLAIM_RETRY_FIRST = 0.2
"""Seconds after a first failed claim; doubled per further failure, up to the cap."""
CLAIM_RETRY_CAP = 5.0
HINTED_RETRY_GAP = 0.1
"""After a failed claim, a wake-up ends the backoff, but not before this many seconds:
hints that keep coming while the claims keep failing cannot spin the loop."""


class Fetching(Holding):
    def wake(self) -> None:
        """A hint that copies are claimable (or the stop): end the fetch's sleep now."""
        self._hinted = True
        if self._hint_waiter is not None:
            _resolve(self._hint_waiter)

    def stop_idle(self) -> None:
        """After the stop: end the wait of every idle handler slot (busy ones see the stop
        when their handler returns and leave the buffer to :meth:`release_unstarted`)."""
        while self._idle_slots:
            _resolve(self._idle_slots.popleft())
        self.wake()  # and the fetch's sleep
        if self._slot_waiter is not None:
            _resolve(self._slot_waiter)  # or its wait for a free slot

    async def fetch(self, stop: asyncio.Event) -> None:
        """Claim while there is capacity; sleep until a hint or the (jittered) poll."""
        pause = self._poll_min
        failures = 0
        limit_per_claim = validate.MAX_CLAIM
        while not stop.is_set():
            room = self.spec.concurrency + self._prefetch()
            capacity = room - len(self._open)
            # While claimed messages still wait in the buffer the executors have work, so
            # wait until half the room is free: one claim then fetches a useful batch
            # instead of a row or two per round trip.
            if capacity <= 0 or (capacity < room // 2 and self._buffer):
                await self._until_slot_freed()
                continue
            # The write-back's backlog is full (a slow database): claim when a write frees it.
            capacity = min(capacity, self._writeback.room())
            if capacity <= 0:
                self._capacity.clear()
                self._writeback.roomy.clear()
                await wait_any(self._capacity, self._writeback.roomy, stop)
                continue
            self._hinted = False
            try:
                found = await self._backend.async_ops.message_claim_many(
                    subscription=self.spec.name,
                    limit=min(capacity, limit_per_claim),
                    lease=self._lease,
                    worker=self._worker_name,
                    max_attempts=self.spec.retry.max_attempts,
                )
            except SqlbrokerError as error:
                failures += 1
                wait = retry_pause(failures, first=CLAIM_RETRY_FIRST, cap=CLAIM_RETRY_CAP)
                log.warning("claim on %s failed (%s); retrying in %.1f s", self.name, error, wait)
                # Back off against a dead database, but a wake-up after the failure (the
                # LISTEN connection back, a publish, a commit SQLite's watcher saw) says
                # it answers again: claim then rather than at the end of the backoff.
                # The stop wakes the pump too (stop_idle).
                gap = min(wait, HINTED_RETRY_GAP)
                await wait_any(stop, timeout=gap)
                await self._sleep_until_hint(wait - gap)
                continue
            failures = 0
            if stop.is_set():
                # The stop came while the claim ran: the shutdown may have released the
                # buffer already, so these go back at once instead of into it.
                if await self._release(found):
                    log.info("released %d message(s) claimed during the stop", len(found))
                return
            for delivery in found:
                # Its Lease as the plain tuple it equals, without Lease.of's cost per claim.
                self._open.add((delivery.id, delivery.lease_token))
                self._held[delivery.id] = delivery
                self._buffer.append(delivery)
            for _ in range(min(len(found), len(self._idle_slots))):
                _resolve(self._idle_slots.popleft())
            if len(found) >= min(capacity, limit_per_claim):
                pause = self._poll_min
                self._drained = False
                continue
            if found or isinstance(found, Claimed):
                self._flow_limited = isinstance(found, Claimed)
            throttled = found.wait if isinstance(found, Claimed) else None
            if throttled is not None:
                # A rate limit holds claims back until then: no hint can change that, so
                # sleep through them instead of claiming nothing on every notification.
                self._drained = False
                await wait_any(stop, timeout=min(throttled, self._poll_max))
                continue
            self._drained = True
            pause = self._poll_min if found else min(pause * 2, self._poll_max)
            await self._sleep_until_hint(pause * random.uniform(0.75, 1.0))

    async def _until_slot_freed(self) -> None:
        """Wait until a delivery is settled (:meth:`_free_slot`) or the stop
        (:meth:`stop_idle`): one future, woken once per claim round on a busy pump."""
        waiter = self._slot_waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._slot_waiter = None

    async def _sleep_until_hint(self, seconds: float) -> None:
        """Sleep ``seconds`` or until :meth:`wake`: one future and one timer, the shortest
        path from a notification to the next claim."""
        if self._hinted:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _resolve, waiter)
        self._hint_waiter = waiter
        try:
            await waiter
        finally:
            self._hint_waiter = None
            timer.cancel()

    def _prefetch(self) -> int:
        if self._flow_limited:
            return 0
        if self.spec.prefetch is not None:
            return self.spec.prefetch
        workers = self.spec.concurrency
        if self._pace is None:
            return workers
        wanted = PREFETCH_WAIT * workers / max(self._pace, 1e-6)
        return max(workers, min(MAX_AUTO_PREFETCH, int(wanted)))
