"""Group commit for Celery's publishes: ``delay()`` calls made at the same time by several
threads of a process share one database transaction.

Each caller still returns only after its own task is committed (durable before
acknowledged). The first caller to find no write in progress becomes the leader: it writes
everything queued by then — its own task and those of the threads that arrived meanwhile —
in one commit, and hands the lead to a thread that queued during that commit, if any, while
the others wait for their task's commit. With one thread this is a plain ``send``; with
many, one commit carries many tasks instead of each waiting for its own flush to disk.

A leader also waits for company, as PostgreSQL's ``commit_delay`` does: when fewer tasks
are queued than the previous commit carried, the threads that commit released are most
likely on their way back with their next task, so it waits until as many are queued — at
most :data:`GATHER_SHARE` of a commit's duration, or twice as long as they took to come back
lately, whichever is longer, and never more than :data:`MAX_GATHER`. (A commit that does not
flush to disk takes less time than the threads' own Celery work: a wait bounded by the
commit alone would end before they are back.) Without the wait the threads split into two
groups that take turns, each commit carrying half of them; with it one commit carries them
all (bench/results/adapters_celery.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import Any

from sqlbroker.app import Broker
from sqlbroker.core.errors import SqlbrokerError, ValidationError
from sqlbroker.features.publishing import PublishOptions

GATHER_SHARE = 0.5
"""The longest wait for company, as a share of a commit's (moving average) duration."""
MAX_GATHER = 0.02
"""The longest wait for company in seconds, however long commits take."""


@dataclass(eq=False)
class _Send:
    queue: str
    message: dict[str, Any]
    priority: int
    at: datetime | None
    task: str | None
    wake: threading.Event = field(default_factory=threading.Event)
    """Set when the send is finished (``error`` says how) or its thread is to lead."""
    finished: bool = False
    error: BaseException | None = None

    @property
    def group(self) -> tuple[str, int, datetime | None, str | None]:
        """What a batch of ``send_many`` shares."""
        return (self.queue, self.priority, self.at, self.task)


class GroupSender:
    """Sends Celery task messages through one :class:`~sqlbroker.Broker`, batching the
    concurrent ones."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        """Notified when a send is queued while a leader is at work."""
        self._pending: list[_Send] = []
        self._leader: _Send | None = None
        """The send whose thread leads (writes the next batch), if any."""
        self._last_batch = 0
        self._write_seconds = 0.0
        """Moving average of a commit's duration."""
        self._return_seconds = 0.0
        """Moving average of a leader's wait for the threads to come back (a wait that ended
        unfilled counts as long as it lasted)."""
        self.batches = 0
        """Commits written so far (sends over batches is the mean batch, for diagnosis)."""

    def send(
        self,
        queue: str,
        message: dict[str, Any],
        *,
        priority: int,
        at: datetime | None,
        task: str | None,
    ) -> None:
        """Send one message to ``queue``; return once it is committed, or raise its error."""
        item = _Send(queue, message, priority, at, task)
        with self._lock:
            self._pending.append(item)
            if self._leader is None:
                self._leader = item
            else:
                self._arrived.notify()
        try:
            while True:
                if self._leader is item:
                    self._lead()
                item.wake.wait()
                if item.finished:
                    break
                item.wake.clear()  # handed the lead: our task is still queued
        except BaseException:
            self._abandon(item)  # interrupted (a signal, a green thread's timeout)
            raise
        if item.error is not None:
            raise item.error

    def _abandon(self, item: _Send) -> None:
        """Take back an unwritten send and pass on the lead if its thread held it, so that
        an interrupted caller leaves no other thread waiting for a leader."""
        with self._lock:
            if item in self._pending:
                self._pending.remove(item)
            if self._leader is item:
                self._hand_on()

    def _hand_on(self) -> None:
        """Pass the lead to the oldest queued send's thread, or give it up (lock held)."""
        self._leader = self._pending[0] if self._pending else None
        if self._leader is not None:
            self._leader.wake.set()

    def _lead(self) -> None:
        """Write one batch, then pass the lead to a queued send's thread (or give it up)."""
        with self._lock:
            expected = self._last_batch
            if len(self._pending) < expected:
                waiting = time.monotonic()
                self._arrived.wait_for(
                    lambda: len(self._pending) >= expected,
                    timeout=min(
                        MAX_GATHER,
                        max(self._write_seconds * GATHER_SHARE, 2 * self._return_seconds),
                    ),
                )
                waited = time.monotonic() - waiting
                self._return_seconds += (waited - self._return_seconds) * 0.2
            batch, self._pending = self._pending, []
            self._last_batch = len(batch)
            self.batches += 1
        started = time.monotonic()
        try:
            self._write(batch)
        except BaseException as error:  # never leave a waiting thread behind
            with self._lock:
                self._leader = None
                rest, self._pending = self._pending, []
            _finish([item for item in [*batch, *rest] if not item.finished], error)
            raise
        self._write_seconds += (time.monotonic() - started - self._write_seconds) * 0.2
        with self._lock:
            self._hand_on()

    def _write(self, batch: list[_Send]) -> None:
        for _, grouped in groupby(batch, key=lambda item: item.group):
            self._write_group(list(grouped))

    def _write_group(self, items: list[_Send]) -> None:
        first = items[0]
        options: PublishOptions = {
            "priority": first.priority,
            "at": first.at,
            "headers": labels(first.task),
        }
        try:
            if len(items) == 1:
                self._broker.send(first.queue, first.message, **options)
            else:
                self._broker.send_many(first.queue, [item.message for item in items], **options)
        except SqlbrokerError as error:
            if len(items) > 1 and isinstance(error, ValidationError):
                # One message is bad (too large, not JSON): each caller gets its own answer.
                for item in items:
                    self._write_group([item])
            else:
                _finish(items, error)
            return
        _finish(items, None)


def _finish(items: Iterable[_Send], error: BaseException | None) -> None:
    for item in items:
        item.error = error
        item.finished = True
        item.wake.set()


def labels(task: str | None) -> dict[str, str] | None:
    """The header that names a Celery task in sqlbroker's listings and dashboard (its id is
    in the payload: a batch shares its headers)."""
    return None if task is None else {"celery-task": task}
