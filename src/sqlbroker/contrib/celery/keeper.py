"""The lease keeper of one Kombu connection: a thread that writes Celery's acks and rejects
to the database in batches and keeps the leases of the messages Celery holds alive.

Celery acknowledges a message by calling ``message.ack()``, from its consumer thread or its
pool's result thread, and expects the call to return at once. The keeper queues the
settlement and commits it in the next batch (every ack that arrives while a batch commits
joins the one after it, as a group commit does). An ack not yet committed when the process
dies is not lost work: the message's lease runs out and it is delivered again, which is the
at-least-once contract (a duplicate for a stated reason: the worker died before its ack
committed).

While a message is held (prefetched, running, or waiting for its ETA in the worker), the
keeper extends its lease every third of the lease, so a long task is not delivered twice;
once the process is gone nobody extends it and another worker gets it after the lease.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlbroker.app import Broker
from sqlbroker.core.errors import LeaseLost, SqlbrokerError
from sqlbroker.core.message import Delivery

logger = logging.getLogger("sqlbroker.contrib.celery")

FAILED_FLUSH_PAUSE = 0.5
"""Seconds before a batch that failed (database unreachable) is tried again."""
FLUSH_TRIES = 20
"""Tries of one settlement before it is given up: its lease then runs out and the message is
delivered again, so giving up loses nothing."""


@dataclass(frozen=True, slots=True)
class _Settlement:
    delivery: Delivery
    action: str
    """``complete``, ``retry`` (requeue, the attempt counted), ``dead`` or ``release``."""
    reason: str = ""
    tries: int = 0


class LeaseKeeper:
    """Batches settlements and extends held leases for one :class:`~sqlbroker.Broker`."""

    def __init__(self, broker: Broker, *, lease: float) -> None:
        self._broker = broker
        self._lease = lease
        self._held: dict[int, tuple[Delivery, float]] = {}
        """Copy id → (delivery, monotonic time its lease was last extended or taken)."""
        self._pending: list[_Settlement] = []
        lock = threading.Lock()
        self._wake = threading.Condition(lock)
        """Notified when a settlement is queued or the keeper stops."""
        self._idle = threading.Condition(lock)
        """Notified when a batch has been written."""
        self._flushing = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    # --- called by the transport (any thread) ------------------------------------------------

    def hold(self, deliveries: list[Delivery]) -> None:
        """Keep these leases alive until they are settled or given back."""
        now = time.monotonic()
        with self._wake:
            for delivery in deliveries:
                self._held[delivery.id] = (delivery, now)
            self._start()

    def settle(self, delivery: Delivery, action: str, reason: str = "") -> None:
        """Queue ``action`` for ``delivery``; the keeper commits it in its next batch."""
        with self._wake:
            self._held.pop(delivery.id, None)
            self._pending.append(_Settlement(delivery, action, reason))
            self._start()
            self._wake.notify()

    def close(self) -> None:
        """Commit what is queued (waiting up to 10 s for it to be committed or given up),
        then stop the thread; held leases are left to the caller (the transport releases
        them first)."""
        with self._wake:
            self._idle.wait_for(
                lambda: not (self._pending or self._flushing) or self._thread is None,
                timeout=10.0,
            )
            self._stopped = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)

    # --- the thread ---------------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(
                target=self._run, name="sqlbroker-celery-keeper", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        every = self._lease / 3
        while True:
            with self._wake:
                if not self._pending and not self._stopped:
                    self._wake.wait(timeout=self._next_extension(every))
                if self._stopped and not self._pending:
                    self._idle.notify_all()
                    return
                batch, self._pending = self._pending, []
                self._flushing = bool(batch)
            failed = self._flush(batch) if batch else []
            self._extend_due(every)
            with self._wake:
                self._pending[:0] = failed
                self._flushing = False
                self._idle.notify_all()
            if failed:
                time.sleep(FAILED_FLUSH_PAUSE)

    def _next_extension(self, every: float) -> float:
        if not self._held:
            return every
        oldest = min(since for _, since in self._held.values())
        return max(0.0, oldest + every - time.monotonic())

    def _flush(self, batch: list[_Settlement]) -> list[_Settlement]:
        """Commit a batch: every complete in one call, the rest one by one. Returns what
        failed and should be tried again."""
        failed: list[_Settlement] = []
        completes = [item for item in batch if item.action == "complete"]
        if completes:
            failed += self._attempt(
                completes, lambda: self._broker.complete([item.delivery for item in completes])
            )
        for item in batch:
            if item.action != "complete":
                failed += self._attempt([item], functools.partial(self._settle_one, item))
        return failed

    def _settle_one(self, item: _Settlement) -> None:
        if item.action == "release":
            self._broker.release(item.delivery)
        elif item.action == "retry":
            self._broker.retry(item.delivery)
        else:
            self._broker.dead_letter(item.delivery, reason=item.reason)

    def _attempt(self, items: list[_Settlement], write: Callable[[], None]) -> list[_Settlement]:
        try:
            write()
        except LeaseLost as lost:
            logger.warning(
                "sqlbroker: %s of %d Celery message(s) came after the lease ran out; another"
                " worker has them (raise broker_transport_options['visibility_timeout']): %s",
                items[0].action,
                len(items),
                lost,
            )
        except SqlbrokerError as error:
            again = [
                _Settlement(item.delivery, item.action, item.reason, item.tries + 1)
                for item in items
                if item.tries + 1 < FLUSH_TRIES
            ]
            logger.warning(
                "sqlbroker: could not write %d Celery %s(s) (%s); %s",
                len(items),
                items[0].action,
                error,
                "trying again" if again else "their leases will run out and they come back",
            )
            return again
        return []

    def _extend_due(self, every: float) -> None:
        now = time.monotonic()
        with self._wake:
            due = [delivery for delivery, since in self._held.values() if now - since >= every]
        for delivery in due:
            try:
                self._broker.extend(delivery, lease=self._lease)
            except LeaseLost:
                logger.warning(
                    "sqlbroker: the lease of Celery message %s ran out before it was extended;"
                    " it may run twice",
                    delivery.message_id,
                )
                with self._wake:
                    self._held.pop(delivery.id, None)
                continue
            except SqlbrokerError as error:
                logger.warning("sqlbroker: could not extend a Celery lease (%s)", error)
                continue
            with self._wake:
                if delivery.id in self._held:
                    self._held[delivery.id] = (delivery, now)
