"""One subscription's pump: fetch, execute, keep leases — write-back is shared.

Invariants:
- a claim never asks for more than the free capacity (``concurrency + prefetch`` minus the
  deliveries claimed and not yet settled), so nothing is claimed that cannot start soon;
  without an explicit ``prefetch`` it is sized so that a claimed message waits about
  ``PREFETCH_WAIT`` in the buffer at the handlers' recent pace (at least the concurrency,
  at most ``MAX_AUTO_PREFETCH``): fast handlers fetch a useful batch per round trip;
- every delivery we hold a lease on is in ``_held`` until its outcome is written back, and
  the lease keeper extends all of them, so a long handler or a slow flush never loses one;
  bookkeeping goes by lease, not by copy: a copy retried at once may be claimed again while
  its first outcome is still being written, and that report must not touch the new claim;
- every delivery a handler started gets exactly one outcome: also when the handler raises a
  ``BaseException``, or is given up inside its transaction (a timeout, a stop at once);
- a delivery whose lease was lost before a handler took it is dropped, not started;
- claimed-but-unstarted deliveries are released on shutdown without counting the attempt,
  and so are the started ones a stop gives up (grace period exceeded): a stop is no failure;
- a delivery whose message was cancelled while held (``Broker.cancel`` flags it, and
  :meth:`Pump.watch_cancels` finds the flag) ends cancelled whatever its handler does:
  a coroutine handler is cancelled, a plain function sees ``msg.cancelled``, an unstarted
  one is not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from sqlbroker.core import validate
from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.flow import Claimed
from sqlbroker.core.message import Delivery, ErrorInfo
from sqlbroker.core.serde import DEFAULT_PAYLOAD_LIMIT
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.features.subscribers import SubscriberSpec
from sqlbroker.runtime.effects import EffectsTransaction
from sqlbroker.runtime.events import WorkerObserver
from sqlbroker.runtime.handling import (
    WorkerStopped,
    call_handler,
    completion,
    failure_outcome,
    report_dead_letter,
)
from sqlbroker.runtime.message import Message
from sqlbroker.runtime.writeback import WriteBack, retry_pause, wait_any
from sqlbroker.storage.backend import Backend

log = logging.getLogger("sqlbroker.runtime")
T = TypeVar("T")
PREFETCH_WAIT = 0.05
MAX_AUTO_PREFETCH = 100
_PACE_WEIGHT = 0.2
CLAIM_RETRY_FIRST = 0.2
"""Seconds after a first failed claim; doubled per further failure, up to the cap."""
CLAIM_RETRY_CAP = 5.0
HINTED_RETRY_GAP = 0.1
"""After a failed claim, a wake-up ends the backoff, but not before this many seconds:
hints that keep coming while the claims keep failing cannot spin the loop."""
LeaseKey = tuple[int, str]


def _key(delivery: Delivery) -> LeaseKey:
    return (delivery.id, delivery.lease_token)


def _running(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread runs ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Pump:
    def __init__(
        self,
        *,
        backend: Backend,
        spec: SubscriberSpec,
        lease: float,
        worker_name: str,
        writeback: WriteBack,
        handler_threads: Executor,
        poll_min: float,
        poll_max: float,
        observer: WorkerObserver | None = None,
        result_limit: int = DEFAULT_PAYLOAD_LIMIT,
    ) -> None:
        self.spec = spec
        self._result_limit = result_limit
        self._observer = observer or WorkerObserver()
        self._backend = backend
        self._lease = spec.lease or lease
        self._worker_name = worker_name
        self._writeback = writeback
        self._threads = handler_threads
        self._poll_min = poll_min
        self._poll_max = poll_max
        self._queue: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._open: set[LeaseKey] = set()  # claimed, no outcome yet
        self._held: dict[int, Delivery] = {}  # by copy: a new claim replaces a lost lease
        self._hinted = False
        self._hint_waiter: asyncio.Future[None] | None = None
        self._slot_waiter: asyncio.Future[None] | None = None
        self._capacity = asyncio.Event()
        # The last claim found fewer copies than it asked for (none left, for all it
        # knows): with nothing open the pump is idle, the worker's stats say for sure.
        self._drained = False
        self._pace: float | None = None  # recent handler seconds (moving average)
        # Whether the last claim went through the subscription's flow limits: then copies
        # claimed ahead of free slots would hold the caps' slots idle in the buffer.
        self._flow_limited = False
        # By copy: the handlers in progress, and the task that runs each.
        self._running: dict[int, tuple[Message, asyncio.Task[Any] | None]] = {}
        self._cancelled_tasks: set[int] = set()  # copies whose handler task we cancelled
        self._cancels = asyncio.Event()  # a cancel was announced for this subscription
        self.background: set[asyncio.Task[Any]] = set()

    @property
    def name(self) -> str:
        return self.spec.name

    def wake(self) -> None:
        """A hint that copies are claimable (or the stop): end the fetch's sleep now."""
        self._hinted = True
        waiter = self._hint_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def busy(self) -> bool:
        return bool(self._held)

    @property
    def idle(self) -> bool:
        """The last claim came back short and every copy it claimed has its outcome: as
        soon as that is written, ``run_until_idle`` may ask the database whether any is
        left, without a further claim that finds nothing."""
        return self._drained and not self._open

    @property
    def open(self) -> int:
        """How many claimed deliveries have no outcome yet."""
        return len(self._open)

    # --- fetch -------------------------------------------------------------------------------

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
            if capacity <= 0 or (capacity < room // 2 and not self._queue.empty()):
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
                self._open.add(_key(delivery))
                self._held[delivery.id] = delivery
                self._queue.put_nowait(delivery)
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

    # --- execute -----------------------------------------------------------------------------

    async def execute(self, stop: asyncio.Event) -> None:
        """Run handlers one at a time until ``stop``; the current one always finishes.

        An idle slot waits on the buffer alone, the cheapest wake-up a claim can give it;
        :meth:`stop_idle` ends that wait with a ``None`` per slot."""
        loop = asyncio.get_running_loop()
        # What every message of this slot gets: made once, not per message.
        manual = self.spec.ack == "manual"
        settle = functools.partial(self._settle_from_any_thread, loop) if manual else None
        effects = functools.partial(self._effects, loop)
        task = asyncio.current_task()  # each handler of this slot runs in it
        while not stop.is_set():
            try:
                # With a backlog buffered, take it without a wait per message.
                delivery = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                delivery = await self._queue.get()
            if delivery is None:
                return
            if stop.is_set():
                # A claim woke this slot just before the stop: release_unstarted hands it
                # back instead.
                self._queue.put_nowait(delivery)
                return
            await self._handle(delivery, settle, effects, task)

    def stop_idle(self) -> None:
        """After the stop: end the wait of every idle handler slot (busy ones see the stop
        when their handler returns and leave the ``None`` for :meth:`release_unstarted`)."""
        for _ in range(self.spec.concurrency):
            self._queue.put_nowait(None)
        self.wake()  # and the fetch's sleep
        if self._slot_waiter is not None:
            _resolve(self._slot_waiter)  # or its wait for a free slot

    async def _handle(
        self,
        delivery: Delivery,
        settle: Callable[[Settlement], None] | None,
        effects: Callable[[Message], EffectsTransaction],
        task: asyncio.Task[Any] | None,
    ) -> None:
        manual = settle is not None
        message = Message(delivery, settle, effects, self._threads, self._result_limit)
        self._running[delivery.id] = (message, task)
        try:
            value = await self._observed_call(delivery, message)
        except asyncio.CancelledError as error:
            if self._uncancel(delivery, task):
                # Our cancel request reached the handler: the copy ends cancelled; a stop
                # of the worker that came as well goes on.
                if message._take_over(uncommitted=True):
                    self._settle(Settlement.cancel(delivery))
                if task is not None and task.cancelling():
                    raise
                return
            if task is None or not task.cancelling():
                # The handler raised it itself: a failure like any other, not our stop.
                self._failed(message, error)
                return
            if message._take_over(uncommitted=True):
                # Our stop is not the message's failure: give its attempt back (a snooze),
                # or every deploy that outlasts the grace period would spend one.
                info = ErrorInfo.from_exception(WorkerStopped("the worker stopped at once"))
                self._settle(Settlement.retry(delivery, 0.0, info, snooze=True))
            raise
        except BaseException as error:
            # SystemExit, KeyboardInterrupt and the like from user code fail the message
            # too: the worker's own stops come as cancellation.
            self._uncancel(delivery, task)
            if message.cancelled and message._take_over(uncommitted=True):
                self._settle(Settlement.cancel(delivery))
            else:
                self._failed(message, error)
        else:
            # A handler that swallowed our cancellation, or a plain function that went on,
            # still ends cancelled: the message was cancelled.
            self._uncancel(delivery, task)
            if message.cancelled:
                if message._take_over(uncommitted=False):
                    self._settle(Settlement.cancel(delivery))
            elif not manual and message._take_over(uncommitted=False):
                self._settle(completion(self.spec, delivery, value, self._result_limit))
        finally:
            self._running.pop(delivery.id, None)

    def _uncancel(self, delivery: Delivery, task: asyncio.Task[Any] | None) -> bool:
        """Take back the cancellation :meth:`_cancel_running` gave the handler's task, if
        it did; ``True`` then."""
        if delivery.id not in self._cancelled_tasks:
            return False
        self._cancelled_tasks.discard(delivery.id)
        if task is not None:
            task.uncancel()
        return True

    def _failed(self, message: Message, error: BaseException) -> None:
        if message._take_over(uncommitted=True):
            self._settle(failure_outcome(self.spec, message.delivery, error))
        else:
            log.warning("handler for %s raised after settling %s: %r", self.name, message, error)

    async def _observed_call(self, delivery: Delivery, message: Message) -> Any:
        started = time.monotonic()
        error: BaseException | None = None
        try:
            with self._observer.handler_scope(delivery):
                return await call_handler(self.spec, self._threads, message)
        except BaseException as raised:
            error = raised
            raise
        finally:
            seconds = time.monotonic() - started
            pace = self._pace
            self._pace = seconds if pace is None else pace + _PACE_WEIGHT * (seconds - pace)
            self._observer.handler_finished(delivery, seconds=seconds, error=error)

    def _settle_from_any_thread(
        self, loop: asyncio.AbstractEventLoop, settlement: Settlement
    ) -> None:
        """A manual ``ack``/``nack``/``reject``: sync handlers call it from their thread, and
        a handler may hand its message to any thread; the pump's state is the loop's."""
        if _running(loop):
            self._settle(settlement)
            return
        # Thread-safe, and raises once the worker's final write-back began: a late ack
        # must fail loudly rather than land in a buffer nobody writes.
        self._writeback.add(settlement)
        with contextlib.suppress(RuntimeError):  # the loop is gone: no slot to free
            loop.call_soon_threadsafe(self._free_slot, settlement.lease)

    def _effects(self, loop: asyncio.AbstractEventLoop, message: Message) -> EffectsTransaction:
        return EffectsTransaction(
            self._backend,
            message.delivery,
            claim=message._begin_settling,
            unclaim=message._abort_settling,
            committed=functools.partial(self._committed_from_any_thread, loop, message),
        )

    def _committed_from_any_thread(self, loop: asyncio.AbstractEventLoop, message: Message) -> None:
        """The message was completed in the handler's own transaction: nothing is left to
        write back, only the slot and the lease to let go."""
        message._end_settling()
        delivery = message.delivery
        if _running(loop):
            self._committed(delivery)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to free
                loop.call_soon_threadsafe(self._committed, delivery)

    def _committed(self, delivery: Delivery) -> None:
        settlement = Settlement.complete(delivery)
        self._free_slot(settlement.lease)
        self._forget(settlement.lease)
        self._observer.outcomes_written([settlement])

    def _settle(self, settlement: Settlement) -> None:
        self._writeback.add(settlement)
        self._free_slot(settlement.lease)

    def _free_slot(self, lease: LeaseKey) -> None:
        self._open.discard(lease)
        self._capacity.set()
        if self._slot_waiter is not None:
            _resolve(self._slot_waiter)
        if self._drained and not self._open:
            # The last claim took all there was and it is settled: nothing will join
            # these outcomes in the write-back's window.
            self._writeback.hurry()
        # A copy settled in its own transaction frees the backlog's room without a write:
        # another subscription's pump may be waiting for it.
        self._writeback.roomy.set()

    def _forget(self, lease: Lease) -> None:
        """Stop extending ``lease`` — unless its copy was claimed again since."""
        held = self._held.get(lease.id)
        if held is not None and held.lease_token == lease.token:
            del self._held[lease.id]

    async def settled(self) -> None:
        """Return once every claimed delivery has its outcome: after the stop, the ones
        still open are those a manual ``ack`` may yet settle, from any thread."""
        while self._open:
            self._capacity.clear()
            await self._capacity.wait()

    # --- after the write-back ----------------------------------------------------------------

    def flushed(self, settlement: Settlement, delivery: Delivery, *, lost: bool) -> None:
        """Called by the worker when ``settlement`` of ``delivery`` was written back (or its
        lease was lost)."""
        self._forget(settlement.lease)
        if lost:
            log.warning(
                "%s: the lease on delivery %d (message %s) was lost before its outcome was"
                " written; another consumer has it now",
                self.name,
                delivery.id,
                delivery.message_id,
            )
            return
        if settlement.kind == "dead":
            report_dead_letter(
                self.spec, delivery, settlement.reason, self._threads, self.background
            )

    # --- leases ------------------------------------------------------------------------------

    async def keep_leases(self, stop: asyncio.Event) -> None:
        """Extend every held lease each third of the lease, until ``stop``."""
        interval = max(0.05, self._lease / 3)
        while not stop.is_set():
            await wait_any(stop, timeout=interval)
            held = list(self._held.values())
            if not held:
                continue
            try:
                extended = await self._backend.async_ops.message_extend_leases(
                    leases=[Lease.of(d) for d in held],
                    lease=self._lease,
                )
            except SqlbrokerError as error:
                log.warning("extending %d leases on %s failed: %s", len(held), self.name, error)
                continue
            lost = {
                _key(d): d
                for d in held
                if d.id not in extended and _key(d) in self._open and self._held.get(d.id) is d
            }
            if lost:
                self._lost(lost)

    # --- cancels -----------------------------------------------------------------------------

    def cancel_hint(self) -> None:
        """A running copy of this subscription was cancelled somewhere: look now."""
        self._cancels.set()

    async def watch_cancels(self, stop: asyncio.Event, *, interval: float) -> None:
        """Until ``stop``: every ``interval`` seconds, or at once after :meth:`cancel_hint`,
        ask which held copies have a cancel request (one query, and none while nothing is
        held), and cancel their handlers."""
        while not stop.is_set():
            await wait_any(self._cancels, stop, timeout=interval)
            self._cancels.clear()
            held = list(self._held)
            if not held or stop.is_set():
                continue
            try:
                flagged = await self._backend.async_ops.message_cancel_requested(ids=held)
            except SqlbrokerError as error:
                log.warning("looking for cancels on %s failed: %s", self.name, error)
                continue
            for delivery_id in flagged:
                self._cancel_running(delivery_id)

    def _cancel_running(self, delivery_id: int) -> None:
        running = self._running.get(delivery_id)
        if running is None:
            self._cancel_unstarted(delivery_id)
            return
        message, task = running
        if message.cancelled:
            return
        log.info(
            "%s: message %s was cancelled; stopping its handler",
            self.name,
            message.id,
            extra={"subscription": self.name, "message_id": message.id},
        )
        message._request_cancel()
        if self.spec.is_async and task is not None:
            # The task is suspended inside the handler (it is in _running, and this runs
            # on the same loop): the CancelledError lands there, and _handle takes it back.
            self._cancelled_tasks.add(delivery_id)
            task.cancel()

    def _cancel_unstarted(self, delivery_id: int) -> None:
        """A cancelled copy still in the buffer is taken out and settled cancelled now."""
        waiting = [self._queue.get_nowait() for _ in range(self._queue.qsize())]
        for item in waiting:
            if item is not None and item.id == delivery_id:
                self._settle(Settlement.cancel(item))
            else:
                self._queue.put_nowait(item)

    def _lost(self, lost: dict[LeaseKey, Delivery]) -> None:
        """Another consumer may have these copies now: those still waiting for a handler
        are dropped, and no lease of them is extended any more (nothing can renew it)."""
        waiting = [self._queue.get_nowait() for _ in range(self._queue.qsize())]
        unstarted: set[LeaseKey] = set()
        for item in waiting:
            if item is not None and _key(item) in lost:
                unstarted.add(_key(item))
            else:
                self._queue.put_nowait(item)
        for key, delivery in lost.items():
            self._forget(Lease.of(delivery))
            if key in unstarted:
                self._free_slot(key)
            log.warning(
                "%s: lost the lease on delivery %d (message %s) %s",
                self.name,
                delivery.id,
                delivery.message_id,
                "before it started; it is not run here"
                if key in unstarted
                else "while it was in progress; it may be delivered again",
            )

    async def release_unstarted(self) -> int:
        """Give back claimed deliveries no handler started; returns how many."""
        unstarted: list[Delivery] = []
        while not self._queue.empty():
            delivery = self._queue.get_nowait()
            if delivery is not None:
                unstarted.append(delivery)
        return await self._release(unstarted)

    async def _release(self, unstarted: list[Delivery]) -> int:
        if not unstarted:
            return 0
        try:
            await self._backend.async_ops.message_release_many(
                leases=[Lease.of(d) for d in unstarted]
            )
        except SqlbrokerError as error:
            log.warning(
                "could not release %d unstarted messages of %s (%s); they return when their"
                " lease expires",
                len(unstarted),
                self.name,
                error,
            )
        for delivery in unstarted:
            self._free_slot(_key(delivery))
            self._forget(Lease.of(delivery))
        return len(unstarted)
