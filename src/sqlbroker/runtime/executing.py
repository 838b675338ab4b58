"""A pump's handler slots: each runs one handler at a time and settles its delivery by
the outcome (manual acks come from any thread, acks in the handler's own transaction
commit there); a cancel found for a held copy cancels its handler or skips it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.message import Delivery, ErrorInfo
from sqlbroker.core.settlements import Settlement
from sqlbroker.runtime.effects import EffectsTransaction
from sqlbroker.runtime.events import NO_SCOPE
from sqlbroker.runtime.handling import WorkerStopped, call_handler, completion, failure_outcome
from sqlbroker.runtime.holding import Holding
from sqlbroker.runtime.message import Message
from sqlbroker.runtime.writeback import wait_any

log = logging.getLogger("sqlbroker.runtime")
_PACE_WEIGHT = 0.2


def _on_loop(loop: asyncio.AbstractEventLoop, function: Callable[..., None], *args: Any) -> None:
    """Call ``function(*args)`` on ``loop``: now when this thread runs it, else soon."""
    try:
        running = asyncio.get_running_loop() is loop
    except RuntimeError:
        running = False
    if running:
        function(*args)
    else:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to do there
            loop.call_soon_threadsafe(function, *args)


class Executing(Holding):
    async def execute(self, stop: asyncio.Event) -> None:
        """Run handlers one at a time until ``stop``; the current one always finishes.

        An idle slot waits for a claim to wake it (one future), and :meth:`stop_idle` ends
        that wait; a slot takes from the buffer only before the stop, so a delivery a claim
        buffered just before it is left to :meth:`release_unstarted`."""
        loop = asyncio.get_running_loop()
        # What every message of this slot gets: made once, not per message.
        manual = self.spec.ack == "manual"
        settle = functools.partial(self._settle_from_any_thread, loop) if manual else None
        effects = functools.partial(self._effects, loop)
        task = asyncio.current_task()  # each handler of this slot runs in it
        while not stop.is_set():
            if self._buffer:
                await self._handle(self._buffer.popleft(), settle, effects, task)
                continue
            waiter = loop.create_future()
            self._idle_slots.append(waiter)
            await waiter

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
            # still ends cancelled: the message was cancelled. (The checks that are cheap
            # come first: this runs for every message.)
            if self._cancelled_tasks:
                self._uncancel(delivery, task)
            if message._cancel is not None and message.cancelled:
                if message._take_over(uncommitted=False):
                    self._settle(Settlement.cancel(delivery))
            elif not manual and message._take_over(uncommitted=False):
                self._settle(
                    Settlement.complete(delivery)
                    if value is None
                    else completion(self.spec, delivery, value, self._result_limit)
                )
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
            scope = self._observer.handler_scope(delivery)
            if scope is NO_SCOPE:  # no observer opens one: no enter and exit per message
                return await call_handler(self.spec, self._threads, message)
            with scope:
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
        # Thread-safe, and raises once the worker's final write-back began: a late ack
        # must fail loudly rather than land in a buffer nobody writes.
        self._writeback.add(settlement)
        _on_loop(loop, self._free_slot, settlement.lease)

    def _effects(self, loop: asyncio.AbstractEventLoop, message: Message) -> EffectsTransaction:
        # Committed in the handler's own transaction, from any thread: nothing is left to
        # write back, only the slot and the lease to let go, on the loop.
        committed = functools.partial(_on_loop, loop, self._committed, message.delivery)
        return EffectsTransaction(self._backend, message, committed=committed)

    def _committed(self, delivery: Delivery) -> None:
        settlement = Settlement.complete(delivery)
        self._free_slot(settlement.lease)
        self._forget(settlement.lease)
        self._observer.outcomes_written([settlement])

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
        message.cancel_event.set()
        if self.spec.is_async and task is not None:
            # The task is suspended inside the handler (it is in _running, and this runs
            # on the same loop): the CancelledError lands there, and _handle takes it back.
            self._cancelled_tasks.add(delivery_id)
            task.cancel()

    def _cancel_unstarted(self, delivery_id: int) -> None:
        """A cancelled copy still in the buffer is taken out and settled cancelled now."""
        for item in self._unqueue(lambda item: item.id == delivery_id):
            self._settle(Settlement.cancel(item))
