"""Group commit for Celery's publishes: ``delay()`` calls made at the same time by several
threads of a process share one database transaction.

Each caller still returns only after its own task is committed (durable before
acknowledged). The first caller to find no write in progress becomes the leader: it writes
everything queued by then — its own task and those of the threads that arrived meanwhile —
and goes on until nothing is left, while the others wait for their task's commit. With one
thread this is a plain ``send``; with many, one commit carries many tasks instead of each
waiting for its own flush to disk.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import Any

from sqlbroker.app import Broker
from sqlbroker.core.errors import SqlbrokerError, ValidationError


@dataclass(eq=False)
class _Send:
    queue: str
    message: dict[str, Any]
    priority: int
    at: datetime | None
    task: str | None
    done: threading.Event = field(default_factory=threading.Event)
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
        self._pending: list[_Send] = []
        self._leading = False

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
            lead = not self._leading
            self._leading = True
        if lead:
            self._lead()
        item.done.wait()
        if item.error is not None:
            raise item.error

    def _lead(self) -> None:
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    self._leading = False
                    return
            try:
                self._write(batch)
            except BaseException as error:  # never leave a waiting thread behind
                with self._lock:
                    self._leading = False
                    rest, self._pending = self._pending, []
                for item in [*batch, *rest]:
                    if not item.done.is_set():
                        _finish([item], error)
                raise

    def _write(self, batch: list[_Send]) -> None:
        for _, grouped in groupby(batch, key=lambda item: item.group):
            self._write_group(list(grouped))

    def _write_group(self, items: list[_Send]) -> None:
        if len(items) == 1:
            self._write_one(items[0])
            return
        first = items[0]
        try:
            self._broker.send_many(
                first.queue,
                [item.message for item in items],
                priority=first.priority,
                at=first.at,
                headers=labels(first.task),
            )
        except ValidationError:
            # One message is bad (too large, not JSON): each caller gets its own answer.
            for item in items:
                self._write_one(item)
            return
        except SqlbrokerError as error:
            _finish(items, error)
            return
        _finish(items, None)

    def _write_one(self, item: _Send) -> None:
        try:
            self._broker.send(
                item.queue,
                item.message,
                priority=item.priority,
                at=item.at,
                headers=labels(item.task),
            )
        except SqlbrokerError as error:
            _finish([item], error)
            return
        _finish([item], None)


def _finish(items: Iterable[_Send], error: BaseException | None) -> None:
    for item in items:
        item.error = error
        item.done.set()


def labels(task: str | None) -> dict[str, str] | None:
    """The header that names a Celery task in sqlbroker's listings and dashboard (its id is
    in the payload: a batch shares its headers)."""
    return None if task is None else {"celery-task": task}
