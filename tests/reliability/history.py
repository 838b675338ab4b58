"""Histories kept outside the system under test.

Every producer, consumer and fault injector appends what it did to its own file, one JSON
object per line, each written with a single ``write`` on an ``O_APPEND`` descriptor. Every
event carries the process id, the process's name, the wall time and ``time.monotonic()``:
CLOCK_MONOTONIC is one clock for every process of the host, so events of different
processes order by it even when a process's wall clock is faked (run faked processes with
``DONT_FAKE_MONOTONIC=1``).

Events (``op``) and their fields:

- ``publish``: ``tag`` (the producer's own unique name for the message, also put in its
  payload), ``key``, ``seq`` (position within the key, from 0), ``ikey`` (idempotency key),
  ``status`` (``ok``; ``failed``: definitely not applied; ``ambiguous``: a commit whose fate
  is unknown), ``id`` (the message id when ``ok``), ``error``, and optionally ``subs``: the
  subscriptions the message must reach (when absent, every one the checker is given).
- ``deliver``: a handler started: ``id``, ``delivery``, ``attempt``, ``token``, ``sub``,
  ``tag``, ``key``, and the database's times of the delivery: ``enqueued_at``,
  ``available_at``, ``expires_at`` (or ``None``) and ``leased_until`` (the lease's end as
  the claim set it), each in seconds since the epoch.
- ``handled``: the handler returned or raised (``error``).
- ``settled``: the runtime committed the outcome (``kind``: ``complete``, ``retry``,
  ``dead``).
- ``settle_lost``: the outcome was refused because the lease had been lost.
- ``fault``: ``kind`` (``kill``, ``stop``, ``cont``, ``restart``, ``terminate``, ``exit``
  (a process about to end itself), ``failover``, ...) and ``target`` (a process id,
  ``"server"``, ``"network"``: the way to the server, or ``"disk"``: the database's
  filesystem, filled up or freed).

The checker (``checker.py``) reads every file of a scenario's directory together.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import sqlbroker
from sqlbroker.core.message import Delivery
from sqlbroker.core.settlements import Settlement
from sqlbroker.runtime.events import WorkerObserver

Event = dict[str, Any]


class HistoryWriter:
    """Appends events to ``directory/<name>-<pid>.jsonl``."""

    def __init__(self, directory: str | os.PathLike[str], name: str) -> None:
        self.name = name
        self.path = Path(directory) / f"{name}-{os.getpid()}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, op: str, **fields: Any) -> None:
        event = {
            "op": op,
            "proc": self.name,
            "pid": os.getpid(),
            "wall": time.time(),
            "mono": time.monotonic(),
            **fields,
        }
        os.write(self._fd, (json.dumps(event, default=str) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)

    # --- producers ---------------------------------------------------------------------------

    def published(
        self,
        tag: str,
        message_id: str,
        *,
        key: str | None = None,
        seq: int = 0,
        ikey: str | None,
        subs: Sequence[str] | None = None,
    ) -> None:
        extra = {} if subs is None else {"subs": list(subs)}
        self.record(
            "publish", tag=tag, key=key, seq=seq, ikey=ikey, status="ok", id=message_id, **extra
        )

    def publish_failed(
        self,
        tag: str,
        error: BaseException,
        *,
        key: str | None = None,
        seq: int = 0,
        ikey: str | None,
        subs: Sequence[str] | None = None,
    ) -> None:
        """Record a failed publish, ambiguous when the error says its commit's fate is
        unknown (``ConnectionLost(ambiguous=True)``) or when it is not a sqlbroker error at
        all (which the checker then reports: none may reach a caller)."""
        if isinstance(error, sqlbroker.ConnectionLost):
            status = "ambiguous" if error.ambiguous else "failed"
        elif isinstance(error, sqlbroker.SqlbrokerError):
            status = "failed"
        else:
            status = "foreign"
        extra = {} if subs is None else {"subs": list(subs)}
        self.record(
            "publish",
            tag=tag,
            key=key,
            seq=seq,
            ikey=ikey,
            status=status,
            error=f"{type(error).__name__}: {error}",
            **extra,
        )

    # --- fault injectors ---------------------------------------------------------------------

    def fault(self, kind: str, target: int | str) -> None:
        self.record("fault", kind=kind, target=target)


def _tag(payload: Any) -> str | None:
    return payload.get("tag") if isinstance(payload, dict) else None


class HistoryObserver(WorkerObserver):
    """A worker observer that records deliveries and their committed or refused outcomes:
    ``broker.add_observer(HistoryObserver(writer))``."""

    def __init__(self, writer: HistoryWriter) -> None:
        self._writer = writer

    def _record(self, op: str, delivery: Delivery, **fields: Any) -> None:
        self._writer.record(
            op,
            id=delivery.message_id,
            delivery=delivery.id,
            attempt=delivery.attempt,
            token=delivery.lease_token,
            sub=delivery.subscription,
            **fields,
        )

    def handler_scope(self, delivery: Delivery) -> AbstractContextManager[object]:
        return self._scope(delivery)

    @contextmanager
    def _scope(self, delivery: Delivery) -> Iterator[object]:
        self._record(
            "deliver",
            delivery,
            tag=_tag(delivery.payload),
            key=delivery.key,
            enqueued_at=delivery.enqueued_at.timestamp(),
            available_at=delivery.available_at.timestamp(),
            expires_at=None if delivery.expires_at is None else delivery.expires_at.timestamp(),
            leased_until=delivery.lease_expires_at.timestamp(),
        )
        yield None

    def handler_finished(
        self, delivery: Delivery, *, seconds: float, error: BaseException | None
    ) -> None:
        self._record(
            "handled", delivery, error=None if error is None else f"{type(error).__name__}"
        )

    def outcomes_written(self, outcomes: Sequence[Settlement]) -> None:
        for outcome in outcomes:
            assert outcome.delivery is not None
            self._record("settled", outcome.delivery, kind=outcome.kind)

    def outcomes_lost(self, outcomes: Sequence[Settlement]) -> None:
        for outcome in outcomes:
            assert outcome.delivery is not None
            self._record("settle_lost", outcome.delivery, kind=outcome.kind)


def read_histories(directory: str | os.PathLike[str]) -> list[Event]:
    """Every event of every history file in ``directory``, in monotonic-time order. A line
    cut short by a SIGKILL mid-write (it cannot be: one ``write`` per line on a local file,
    but a test must not trust that) is skipped and counted under ``op = "torn"``."""
    events: list[Event] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                events.append({"op": "torn", "file": path.name, "mono": 0.0})
    events.sort(key=lambda event: event["mono"])
    return events
