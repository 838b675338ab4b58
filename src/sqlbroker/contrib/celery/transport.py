"""A Kombu virtual transport on sqlbroker: Celery's queues are sqlbroker queues.

Each Kombu queue is the sqlbroker queue (subscription) of the same name; a published Kombu
message (body, headers, properties) is stored whole as the JSON payload of one message. The
mapping of Celery's habits onto sqlbroker's contracts:

- ``message.ack()`` completes the copy; ``reject(requeue=True)`` gives it back as a retry
  (the attempt counts, so a message that keeps failing ends dead-lettered instead of looping);
  ``reject(requeue=False)`` dead-letters it, kept with the whole message and the reason;
  messages held but never started when the connection closes are released (attempt not
  counted).
- A claim is a lease (``visibility_timeout``, default 30 s). The :class:`LeaseKeeper` extends
  the leases of every message the worker holds, so only a worker that died loses them: its
  messages come back after the lease (``acks_late=True`` tasks then run again).
- ``priority`` 0–9 keeps its Celery-on-Redis meaning, which is sqlbroker's: 0 is the most
  urgent.
- A task with a future ``eta`` (``countdown=``/``eta=``, retries with a countdown) is stored
  with that availability time, so it waits in the database, not in a worker's memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from queue import Empty
from typing import Any

from kombu.transport import virtual

import sqlbroker
from sqlbroker.app import Broker
from sqlbroker.contrib.celery.keeper import LeaseKeeper, logger
from sqlbroker.contrib.celery.sending import GroupSender, labels
from sqlbroker.core import validate
from sqlbroker.core.errors import (
    ConnectionLost,
    DatabaseBusy,
    InvalidName,
    InvalidOption,
    SqlbrokerError,
    StorageFull,
)
from sqlbroker.core.message import Delivery
from sqlbroker.core.topics import validate_topic
from sqlbroker.storage.caller import CallerConnection

DEFAULT_VISIBILITY_TIMEOUT = 30.0
DEFAULT_POLLING_INTERVAL = 0.1
DEFAULT_CLAIM_BATCH = 16
MAX_PRIORITY = 9

_caller_connection: contextvars.ContextVar[CallerConnection | None] = contextvars.ContextVar(
    "sqlbroker_celery_connection", default=None
)


@contextlib.contextmanager
def publishing_in(conn: CallerConnection) -> Iterator[None]:
    """Within the block, Celery tasks sent from this thread or task (``delay``,
    ``apply_async``) are written through ``conn``, the caller's open database connection
    (psycopg, sqlite3, SQLAlchemy or Django, as ``Broker.publish(conn=)`` takes), inside the
    caller's transaction: they exist if and only if it commits."""
    token = _caller_connection.set(conn)
    try:
        yield
    finally:
        _caller_connection.reset(token)


def queue_name(queue: str) -> str:
    """The sqlbroker queue that carries the Kombu queue ``queue``: the same name when it is
    a valid sqlbroker name, otherwise a readable stem and a hash (``celery@host.pidbox``
    becomes ``kombu.celery-host-pidbox.<hash>``)."""
    with contextlib.suppress(InvalidName):
        return validate_topic(queue, "queue")
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", queue).strip("-")[:40] or "queue"
    digest = hashlib.sha256(queue.encode("utf-8")).hexdigest()[:16]
    return f"kombu.{stem}.{digest}"


def _eta(headers: dict[str, Any]) -> datetime | None:
    """The task's ETA (Celery message protocol 2) when it is a timezone-aware time."""
    text = headers.get("eta")
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None or when.tzinfo.utcoffset(when) is None:
        return None  # naive: Celery decides in its own timezone; deliver now
    return when.astimezone(UTC)


def _priority(message: dict[str, Any]) -> int:
    try:
        value = int(message["properties"].get("priority") or 0)
    except (TypeError, ValueError, KeyError, AttributeError):
        return 0
    return min(max(value, 0), MAX_PRIORITY)


def broker_options(
    setting: str,
    options: dict[str, Any],
    known: frozenset[str],
    own: tuple[str, ...],
    unlisted: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The :class:`~sqlbroker.Broker` keyword arguments of Celery's transport options
    ``setting``: its ``broker_options`` dict and the options in ``own`` (which that dict must
    not repeat); an option neither ``known`` nor ``unlisted`` (read by others) is an error."""
    unknown = sorted(set(options) - known - unlisted)
    if unknown:
        raise InvalidOption(
            setting,
            f"unknown option(s) {', '.join(unknown)} for sqlbroker"
            f" (known: {', '.join(sorted(known))})",
        )
    extra = options.get("broker_options", {})
    if not isinstance(extra, dict) or set(own) & set(extra):
        raise InvalidOption(
            "broker_options",
            f"must be a dict of Broker options ({', '.join(own)} are options of their own)",
        )
    return {**extra, **{name: options[name] for name in own if name in options}}


@dataclass(eq=False)
class _Shared:
    """One :class:`~sqlbroker.Broker` (and its group sender) for every Kombu connection of
    a process to the same database with the same options: Celery's producer pool holds one
    connection per publishing thread, and their sends can only share commits (and a
    connection pool) through one broker."""

    key: tuple[int, str, str]
    broker: Broker
    sender: GroupSender
    users: int = 0


_SHARED: dict[tuple[int, str, str], _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _acquire(url: str, options: dict[str, Any]) -> _Shared:
    key = (os.getpid(), url, json.dumps(options, sort_keys=True, default=str))
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            broker = Broker(url, **options)
            shared = _SHARED[key] = _Shared(key, broker, GroupSender(broker))
        shared.users += 1
        return shared


def _release(shared: _Shared) -> None:
    with _SHARED_LOCK:
        shared.users -= 1
        if shared.users > 0:
            return
        _SHARED.pop(shared.key, None)
    try:
        shared.broker.close()
    except SqlbrokerError as error:  # pragma: no cover - closing a dead connection
        logger.warning("sqlbroker: closing the broker failed: %s", error)


class QoS(virtual.QoS):
    """Kombu's prefetch accounting, with acks, rejects and restores written to sqlbroker."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        self.channel._settle(delivery_tag, "complete")
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            self.channel._settle(delivery_tag, "retry")
        else:
            self.channel._settle(delivery_tag, "dead", "rejected by Celery")
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Give back every held, unacknowledged message (attempt not counted)."""
        self._flush()
        for tag in list(self._delivered):
            self.channel._settle(tag, "release")
        self._delivered.clear()
        return []


class Channel(virtual.Channel):
    """One Kombu channel over the connection's :class:`~sqlbroker.Broker`."""

    QoS = QoS
    connection: Transport
    supports_fanout = False
    default_priority = 0
    min_priority = 0
    max_priority = MAX_PRIORITY

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._pid = os.getpid()
        self._held: dict[str, Delivery] = {}
        """Delivery tag (the lease token) → delivery, for messages Kombu holds."""
        self._ahead: dict[str, deque[Delivery]] = {}
        """Claimed in a batch, not yet handed to Kombu (their leases are kept too)."""
        self._empty_until: dict[str, float] = {}

    # --- publishing --------------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        headers = message.get("headers") or {}
        task = headers.get("task")
        task = task if isinstance(task, str) and 0 < len(task) <= 200 else None
        name = queue_name(queue)
        priority = _priority(message)
        at = _eta(headers)  # a past ETA is available at once
        conn = _caller_connection.get()
        if conn is None:
            self.connection.sender.send(name, message, priority=priority, at=at, task=task)
        else:  # the caller's transaction: written now, committed by the caller
            self.connection.broker.send(
                name, message, priority=priority, at=at, headers=labels(task), conn=conn
            )

    # --- consuming ---------------------------------------------------------------------------

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        ahead = self._ahead.setdefault(queue, deque())
        if not ahead:
            now = time.monotonic()
            if self._empty_until.get(queue, 0.0) > now:
                raise Empty()
            claimed = self.connection.broker.claim(
                queue_name(queue),
                limit=self._claim_size(),
                lease=self.connection.lease,
            )
            if not claimed:
                # Another claim right away would find nothing either; Kombu cycles through
                # every consumed queue (pidbox ones included), so wait one polling interval.
                self._empty_until[queue] = now + self.connection.polling_interval
                raise Empty()
            self.connection.keeper.hold(claimed)
            ahead.extend(claimed)
        delivery = ahead.popleft()
        message = delivery.payload
        if not isinstance(message, dict) or not isinstance(message.get("properties"), dict):
            self.connection.keeper.settle(delivery, "dead", "not a Kombu message")
            raise Empty()
        properties = message["properties"]
        properties["delivery_tag"] = delivery.lease_token
        info = properties.setdefault("delivery_info", {})
        info["redelivered"] = delivery.attempt > 1
        message["redelivered"] = delivery.attempt > 1
        self._held[delivery.lease_token] = delivery
        return message

    def _claim_size(self) -> int:
        room = self.qos.can_consume_max_estimate()
        batch: int = self.connection.claim_batch
        if room is None:
            return batch
        buffered = sum(len(ahead) for ahead in self._ahead.values())
        return int(max(1, min(batch, room - buffered)))

    def _settle(self, delivery_tag: str, action: str, reason: str = "") -> None:
        delivery = self._held.pop(delivery_tag, None)
        if delivery is not None and os.getpid() == self._pid:
            self.connection.keeper.settle(delivery, action, reason)

    def _size(self, queue: str) -> int:
        name = queue_name(queue)
        for stats in self.connection.broker.stats():
            if stats.subscription == name:
                return int(stats.ready)
        return 0

    def _purge(self, queue: str) -> int:
        """Cancel the ready messages of ``queue`` (running ones finish); return how many."""
        if not self._has_queue(queue):
            return 0
        name = queue_name(queue)
        broker = self.connection.broker
        purged = 0
        while True:
            ready = broker.pending(name, state="available", limit=1000)
            if not ready:
                return purged
            for copy in ready:
                purged += broker.cancel(copy.message_id, note=f"celery purge of {queue}")

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        name = queue_name(queue)
        return any(s.name == name for s in self.connection.broker.subscriptions())

    def close(self) -> None:
        if not self.closed and os.getpid() == self._pid:
            for ahead in self._ahead.values():
                while ahead:
                    self.connection.keeper.settle(ahead.popleft(), "release")
        super().close()


class Transport(virtual.Transport):
    """The ``sqlbroker`` Kombu transport: ``sqlbroker+postgresql://…`` or
    ``sqlbroker+sqlite:///path.db``.

    ``broker_transport_options`` (Celery) or ``transport_options`` (Kombu):

    - ``visibility_timeout``: seconds a claimed message stays leased to a worker that stops
      extending it (it died) before it is delivered again (default 30);
    - ``polling_interval``: seconds between two claims of an empty queue (default 0.1);
    - ``claim_batch``: messages claimed at once, within Celery's prefetch (default 16);
    - ``max_attempts``: deliveries before a message is dead-lettered (default 5);
    - ``migrate``: create or upgrade the schema on connect (default: on SQLite only);
    - ``broker_options``: more keyword arguments of :class:`~sqlbroker.Broker` (``schema``,
      ``pool_size``, ``synchronous_commit``, …).
    """

    Channel = Channel
    driver_type = "sqlbroker"
    driver_name = "sqlbroker"
    can_parse_url = True
    polling_interval = DEFAULT_POLLING_INTERVAL
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors,
        ConnectionLost,
        DatabaseBusy,
        StorageFull,
    )
    """Errors that pass once the database is back (reachable, unlocked, with free disk):
    Kombu retries a publish on them (``retry=True``) and a Celery worker's consumer
    reconnects with its backoff, instead of failing the send or stopping the worker."""
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic"]), heartbeats=False
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        options = dict(client.transport_options or {})
        self._broker_options = broker_options(
            "broker_transport_options",
            options,
            _TRANSPORT_OPTIONS,
            ("lease", "max_attempts", "migrate"),
            _KOMBU_OPTIONS,
        )
        self.lease = validate.lease_seconds(
            options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT), "visibility_timeout"
        )
        self.claim_batch = validate.integer(
            options.get("claim_batch", DEFAULT_CLAIM_BATCH), "claim_batch", minimum=1, maximum=1000
        )
        self._broker_options["lease"] = self.lease
        self._url = str(client.hostname or "")
        self._lock = threading.Lock()
        self._shared: _Shared | None = None
        self._keeper: LeaseKeeper | None = None
        super().__init__(client, **kwargs)

    @property
    def broker(self) -> Broker:
        """The :class:`~sqlbroker.Broker` of this connection (shared with the process's other
        connections to the same database), opened on first use."""
        return self._opened().broker

    @property
    def sender(self) -> GroupSender:
        """Publishes of concurrent threads, batched into shared commits."""
        return self._opened().sender

    def _opened(self) -> _Shared:
        if self._shared is None:
            with self._lock:
                if self._shared is None:
                    self._shared = _acquire(self._url, self._broker_options)
        return self._shared

    @property
    def keeper(self) -> LeaseKeeper:
        """The lease keeper of this connection's held messages."""
        if self._keeper is None:
            with self._lock:
                if self._keeper is None:
                    self._keeper = LeaseKeeper(self.broker, lease=self.lease)
        return self._keeper

    def establish_connection(self) -> Transport:
        self.broker.subscriptions()  # an unreachable database or a missing schema fails here
        result: Transport = super().establish_connection()
        return result

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        with self._lock:
            keeper, self._keeper = self._keeper, None
            shared, self._shared = self._shared, None
        if keeper is not None:
            keeper.close()
        if shared is not None:
            _release(shared)

    def driver_version(self) -> str:
        return sqlbroker.__version__

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        raise NotImplementedError  # Kombu then shows the URL with its password masked


_TRANSPORT_OPTIONS = frozenset(
    {
        "visibility_timeout",
        "polling_interval",
        "claim_batch",
        "max_attempts",
        "migrate",
        "broker_options",
    }
)
_KOMBU_OPTIONS = frozenset(
    {
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "confirm_publish",
        "body_encoding",
        "deadletter_queue",
        "errback",
        "on_revive",
        "retry_errors",
    }
)
"""Options Kombu and Celery themselves read from the transport options (a publish's
``retry_policy`` is copied into them, so every keyword of Kombu's ``ensure`` is one)."""
