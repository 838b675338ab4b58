"""The synchronous ``Broker``: publishing, the low-level consumer API and administration."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self

from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import InvalidOption, LeaseLost, SchemaError
from sqlbroker.core.message import (
    NORMAL,
    ArchivedMessage,
    Delivery,
    ErrorInfo,
    NewMessage,
    Outcome,
    PendingMessage,
    State,
    Subscription,
    SubscriptionStats,
)
from sqlbroker.core.observability import AuditEntry, SeriesPoint, WorkerInfo
from sqlbroker.core.schedules import DEFAULT_GRACE, Missed, Schedule
from sqlbroker.core.serde import DEFAULT_PAYLOAD_LIMIT, check_payload_limit
from sqlbroker.core.topics import validate_pattern, validate_topic
from sqlbroker.features import metrics
from sqlbroker.features.dead_letters import DeadLetters
from sqlbroker.features.processed import Once, make_once
from sqlbroker.features.publishing import (
    PublishDefaults,
    build_batch,
    build_message,
    check_options,
    with_headers,
)
from sqlbroker.features.sagas import Sagas
from sqlbroker.features.schedules import ScheduleRun, Schedules
from sqlbroker.storage.base import Backend, DeadRequest, Lease, ReapResult, RetryRequest
from sqlbroker.storage.factory import open_backend
from sqlbroker.storage.url import parse_url, redact

DEFAULT_URL = "sqlite:///sqlbroker.db"
DEFAULT_LEASE = 30.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_DEDUPE_WINDOW = 24 * 3600.0


def _deliveries(value: Delivery | Iterable[Delivery], field: str = "deliveries") -> list[Delivery]:
    if isinstance(value, Delivery):
        return [value]
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidOption(field, "must be a Delivery or a list of them")
    items = list(value)
    seen: set[int] = set()
    for item in items:
        if not isinstance(item, Delivery):
            raise InvalidOption(field, f"must hold Delivery objects, not {type(item).__name__}")
        # Two deliveries of one copy (a stale one and its re-claim) cannot be told apart by
        # the write, which matches on the copy: the stale one's refusal would go unreported.
        if item.id in seen:
            raise InvalidOption(
                field, f"holds two deliveries of copy {item.id}: settle each copy once per call"
            )
        seen.add(item.id)
    return items


def _one(value: Delivery | Iterable[Delivery]) -> Delivery:
    """The one delivery that retry, dead_letter and extend act on."""
    items = _deliveries(value, "delivery")
    if len(items) != 1:
        raise InvalidOption("delivery", f"must be one Delivery, not {len(items)}")
    return items[0]


class Broker:
    """A message broker in your database.

    ``Broker("sqlite:///app.db")`` or ``Broker("postgresql://…")``. On SQLite the schema is
    created on first use; on PostgreSQL run :meth:`migrate` (or ``sqlbroker migrate``) once,
    with a role allowed to create tables, or pass ``migrate=True``.

    Every duration takes seconds or a :class:`datetime.timedelta`. Bad arguments raise a
    ``ValidationError`` subclass before anything is written.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        migrate: bool | None = None,
        lease: float | timedelta = DEFAULT_LEASE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        dedupe_window: float | timedelta = DEFAULT_DEDUPE_WINDOW,
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
        clock: Clock | None = None,
        **backend_options: Any,
    ) -> None:
        parsed = parse_url(url)
        self._url = parsed
        self._lease = validate.lease_seconds(lease)
        self._defaults = PublishDefaults(
            max_attempts=validate.integer(
                max_attempts, "max_attempts", minimum=1, maximum=validate.MAX_ATTEMPTS
            ),
            dedupe_window=validate.seconds(dedupe_window, "dedupe_window", allow_zero=False),
            payload_limit=check_payload_limit(payload_limit),
        )
        self._migrate = parsed.scheme == "sqlite" if migrate is None else bool(migrate)
        self._backend: Backend = open_backend(url, clock=clock, **backend_options)
        self._ready = False
        self._ready_lock = threading.Lock()
        self.dead_letters = DeadLetters(self._checked)
        self._schedules = Schedules(self._checked, self._defaults)
        self._publish_listeners: list[Callable[[str | None], None]] = []
        self._header_hooks: list[Callable[[], Mapping[str, str]]] = []

    def add_header_hook(self, hook: Callable[[], Mapping[str, str]]) -> None:
        """Call ``hook()`` once per publish call and add the headers it returns to each
        message that does not set them itself (tracing injects ``traceparent`` this way)."""
        self._header_hooks.append(hook)

    def add_publish_listener(self, listener: Callable[[str | None], None]) -> None:
        """Call ``listener(subscription)`` after each publish this broker commits
        (``None``: any subscription may have new work). In-process wake-ups use it."""
        self._publish_listeners.append(listener)

    def remove_publish_listener(self, listener: Callable[[str | None], None]) -> None:
        with contextlib.suppress(ValueError):
            self._publish_listeners.remove(listener)

    def _insert(self, messages: list[NewMessage], queue: str | None, conn: Any) -> list[str]:
        if self._header_hooks:
            messages = with_headers(messages, self._header_hooks)
        result = self._checked().message_insert_many(
            messages=messages, subscription=queue, conn=conn
        )
        # With conn= the caller has not committed yet; NOTIFY or the change watcher
        # tells the workers once it does.
        if conn is None:
            for listener in list(self._publish_listeners):
                listener(queue)
        return result.message_ids

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL with any password replaced by ``***``."""
        return str(self._url)

    @property
    def backend(self) -> Backend:
        """The storage backend (for the runtime and advanced use)."""
        return self._checked()

    @property
    def publish_defaults(self) -> PublishDefaults:
        """The defaults every publish starts from (``max_attempts``, ``dedupe_window``, …)."""
        return self._defaults

    @property
    def lease(self) -> float:
        """The default lease, in seconds."""
        return self._lease

    @property
    def backend_name(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._url.scheme

    @property
    def in_memory(self) -> bool:
        return self._url.path == ":memory:"

    def __repr__(self) -> str:
        return f"Broker({redact(self._url.raw)!r})"

    def _checked(self) -> Backend:
        if not self._ready:
            with self._ready_lock:
                if not self._ready:
                    # Read the version first: a migration takes the write lock, which a
                    # caller's open transaction (conn=) may hold on SQLite.
                    if self._migrate:
                        try:
                            self._backend.check_schema()
                        except SchemaError:
                            self._backend.migrate()
                    self._backend.check_schema()
                    self._ready = True
        return self._backend

    def migrate(self) -> list[int]:
        """Apply pending schema migrations; safe when several processes migrate at once."""
        applied = self._backend.migrate()
        self._backend.check_schema()
        self._ready = True
        return applied

    def schema_version(self) -> int:
        return self._backend.schema_version()

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    @staticmethod
    def worker_name() -> str:
        """How this process names itself in leases: ``host:pid``."""
        return f"{socket.gethostname()}:{os.getpid()}"

    # --- publishing --------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | None = None,
        priority: int = NORMAL,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        ttl: float | timedelta | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        dedupe_window: float | timedelta | None = None,
        content_type: str | None = None,
        conn: Any = None,
    ) -> str:
        """Publish to every subscription whose pattern matches ``topic``; return the message id.

        Returns after the message is committed (or, with ``conn``, written in the caller's
        open transaction, which the caller commits). A topic no subscription matches is
        archived as ``unrouted``. A repeated ``idempotency_key`` within its window returns
        the first message's id and writes nothing.
        """
        message = build_message(
            topic,
            payload,
            defaults=self._defaults,
            key=key,
            priority=priority,
            delay=delay,
            at=at,
            ttl=ttl,
            expires_at=expires_at,
            max_attempts=max_attempts,
            headers=headers,
            idempotency_key=idempotency_key,
            dedupe_window=dedupe_window,
            content_type=content_type,
        )
        return self._insert([message], None, conn)[0]

    def publish_many(self, messages: Iterable[Mapping[str, Any]], *, conn: Any = None) -> list[str]:
        """Publish a batch in one transaction. Each item is a mapping with ``topic``,
        ``payload`` and any option of :meth:`publish`. Returns the ids in order."""
        batch = build_batch(messages, defaults=self._defaults)
        if not batch:
            return []
        return self._insert(batch, None, conn)

    def send(
        self,
        queue: str,
        payload: Any,
        *,
        key: str | None = None,
        priority: int = NORMAL,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        ttl: float | timedelta | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        dedupe_window: float | timedelta | None = None,
        content_type: str | None = None,
        conn: Any = None,
    ) -> str:
        """Point-to-point: deliver to the subscription named ``queue`` only, creating it on
        first use (in the same transaction). Same options as :meth:`publish`."""
        validate_topic(queue, "queue")
        message = build_message(
            queue,
            payload,
            defaults=self._defaults,
            key=key,
            priority=priority,
            delay=delay,
            at=at,
            ttl=ttl,
            expires_at=expires_at,
            max_attempts=max_attempts,
            headers=headers,
            idempotency_key=idempotency_key,
            dedupe_window=dedupe_window,
            content_type=content_type,
        )
        return self._insert([message], queue, conn)[0]

    def send_many(
        self, queue: str, payloads: Iterable[Any], *, conn: Any = None, **options: Any
    ) -> list[str]:
        """Send a batch of payloads to ``queue`` in one transaction, sharing ``options``."""
        validate_topic(queue, "queue")
        check_options(options)
        batch = build_batch(payloads, defaults=self._defaults, topic=queue, options=options)
        if not batch:
            return []
        return self._insert(batch, queue, conn)

    # --- subscriptions -----------------------------------------------------------------------

    def subscribe(
        self, name: str, patterns: str | Sequence[str], *, replace: bool = False
    ) -> Subscription:
        """Create the subscription ``name`` (or add patterns to it). From now on it gets its
        own copy of every message published to a matching topic. ``replace=True`` sets the
        patterns to exactly ``patterns``."""
        validate_topic(name, "name")
        pattern_list = (
            [patterns]
            if isinstance(patterns, str)
            else validate.items(patterns, "patterns", "patterns")
        )
        if not pattern_list:
            raise InvalidOption("patterns", "give at least one pattern")
        if len(pattern_list) > 100:
            raise InvalidOption("patterns", "a subscription has at most 100 patterns")
        checked = [validate_pattern(pattern, "patterns") for pattern in pattern_list]
        return self._checked().subscription_upsert(name=name, patterns=checked, replace=replace)

    def unsubscribe(self, name: str) -> bool:
        """Delete a subscription and its pending messages (dead letters and archive stay)."""
        validate_topic(name, "name")
        return self._checked().subscription_delete(name=name)

    def subscriptions(self) -> list[Subscription]:
        return self._checked().subscription_list()

    # --- the low-level consumer API ----------------------------------------------------------

    def claim(
        self,
        subscription: str,
        *,
        limit: int = 1,
        lease: float | timedelta | None = None,
        worker: str | None = None,
    ) -> list[Delivery]:
        """Lease up to ``limit`` messages, most urgent first. Each delivery carries a lease
        token; complete, retry or dead-letter it before ``lease`` seconds pass, or it is
        delivered again."""
        validate_topic(subscription, "subscription")
        count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_CLAIM)
        seconds = self._lease if lease is None else validate.lease_seconds(lease)
        if worker is not None and (not isinstance(worker, str) or not 0 < len(worker) <= 200):
            raise InvalidOption("worker", "must be a string of 1 to 200 characters")
        return self._checked().message_claim_many(
            subscription=subscription,
            limit=count,
            lease=seconds,
            worker=worker or self.worker_name(),
        )

    @staticmethod
    def _raise_lost(wanted: Iterable[int], done: Iterable[int]) -> None:
        lost = sorted(set(wanted) - set(done))
        if lost:
            raise LeaseLost(lost)

    def complete(self, deliveries: Delivery | Iterable[Delivery], *, conn: Any = None) -> None:
        """Acknowledge deliveries: they are archived as completed. Those whose lease was lost
        are left alone and reported by one ``LeaseLost`` after the others are completed.

        With ``conn`` the acknowledgement joins the caller's open transaction (as a publish
        with ``conn`` does), so the caller's writes and the ack commit together; on
        ``LeaseLost`` the caller should roll back, as another consumer has the message."""
        items = _deliveries(deliveries)
        if not items:
            return
        done = self._checked().message_complete_many(leases=[Lease.of(d) for d in items], conn=conn)
        self._raise_lost((d.id for d in items), done)

    def retry(
        self,
        delivery: Delivery,
        *,
        after: float | timedelta = 0.0,
        error: BaseException | str | None = None,
    ) -> None:
        """Give a delivery back to be tried again after ``after`` seconds. When its attempts
        are spent it is dead-lettered instead (reason ``max attempts exhausted``)."""
        item = _one(delivery)
        delay = validate.seconds(after, "after")
        info = ErrorInfo.coerce(error)
        if item.attempt >= item.max_attempts:
            self._dead(
                item, f"max attempts exhausted ({item.attempt} of {item.max_attempts})", info
            )
            return
        done = self._checked().message_retry_many(
            retries=[RetryRequest(Lease.of(item), delay, info)]
        )
        self._raise_lost([item.id], done)

    def dead_letter(
        self, delivery: Delivery, *, reason: str, error: BaseException | str | None = None
    ) -> None:
        """Move a delivery to the dead letters now, keeping the whole message and why."""
        item = _one(delivery)
        self._dead(item, validate.reason(reason), ErrorInfo.coerce(error))

    def _dead(self, item: Delivery, reason: str, info: ErrorInfo | None) -> None:
        done = self._checked().message_dead_many(deaths=[DeadRequest(Lease.of(item), reason, info)])
        self._raise_lost([item.id], done)

    def extend(self, delivery: Delivery, *, lease: float | timedelta | None = None) -> datetime:
        """Push the delivery's lease to now + ``lease``; return the new expiry."""
        item = _one(delivery)
        seconds = self._lease if lease is None else validate.lease_seconds(lease)
        extended = self._checked().message_extend_leases(leases=[Lease.of(item)], lease=seconds)
        self._raise_lost([item.id], extended)
        return extended[item.id]

    def release(self, deliveries: Delivery | Iterable[Delivery]) -> None:
        """Give back deliveries that were never started; the attempt is not counted."""
        items = _deliveries(deliveries)
        if items:
            done = self._checked().message_release_many(leases=[Lease.of(d) for d in items])
            self._raise_lost((d.id for d in items), done)

    def cancel(self, message_id: str) -> int:
        """Cancel every copy of a message that is not running; return how many were cancelled."""
        canonical = validate.message_id(message_id)
        return self._checked().message_cancel_many(message_ids=[canonical])

    # --- maintenance -------------------------------------------------------------------------

    def reap(self, *, limit: int = 1000) -> dict[str, int]:
        """One maintenance pass (the worker runs this periodically): release expired leases,
        dead-letter copies whose attempts are spent, expire TTLs, trim idempotency keys and
        processed keys past their window."""
        count = validate.integer(limit, "limit", minimum=1, maximum=100_000)
        backend = self._checked()
        leases: ReapResult = backend.lease_release_expired(limit=count)
        return {
            "released": leases.released,
            "dead": leases.dead,
            "expired": backend.message_expire(limit=count),
            "unblocked": backend.key_repair(limit=count),
            "dedupe_trimmed": backend.dedupe_trim(limit=count),
            "processed_trimmed": backend.processed_trim(limit=count),
            "sagas_swept": self.sagas.sweep(limit=count),
        }

    # --- sagas -------------------------------------------------------------------------------

    @property
    def sagas(self) -> Sagas:
        """Start, cancel and read sagas (``broker.sagas.start(saga, data)``); see
        :mod:`sqlbroker.features.sagas`. Steps are handled by the app ``Broker``'s
        ``saga_step`` and ``saga_compensation`` subscribers."""
        return Sagas(self._checked(), self._defaults)

    # --- processed keys ----------------------------------------------------------------------

    def once(
        self,
        scope: str,
        key: str,
        *,
        lease: float | timedelta | None = None,
        window: float | timedelta | None = None,
    ) -> Once:
        """Run an effect outside the database once per ``key`` within ``window``:
        ``with broker.once("charge", order_id) as first: if first: charge(…)``.

        ``scope`` names the effect (a topic-like name), ``key`` the business key. The key
        is reserved for ``lease`` seconds (default 60) while the block runs, and kept as
        done for ``window`` (default: the broker's ``dedupe_window``) when it ends
        normally; an exception releases it for the retry. A key another consumer holds
        raises ``KeyInProgress``, which the runtime treats as a snooze. See
        :mod:`sqlbroker.features.processed` for what it guarantees and what it cannot.
        """
        return make_once(
            self._checked(),
            scope,
            key,
            lease=lease,
            window=window,
            default_window=self._defaults.dedupe_window,
        )

    def forget(self, scope: str, key: str) -> bool:
        """Delete a processed key whatever its state, so its effect may run again."""
        validate_topic(scope, "scope")
        checked = validate.key(key, "key")
        if checked is None:
            raise InvalidOption("key", "is required")
        return self._checked().processed_forget(scope=scope, key=checked)

    # --- inspection --------------------------------------------------------------------------

    def pending(
        self, subscription: str | None = None, *, state: State | str | None = None, limit: int = 100
    ) -> list[PendingMessage]:
        """Copies still in the queue (available, scheduled, blocked or running), oldest first."""
        if subscription is not None:
            validate_topic(subscription, "subscription")
        try:
            chosen = None if state is None else State(state)
        except ValueError:
            raise InvalidOption("state", f"must be one of {[s.value for s in State]}") from None
        count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
        return self._checked().message_list(subscription=subscription, state=chosen, limit=count)

    def archive(
        self,
        subscription: str | None = None,
        *,
        outcome: Outcome | str | None = None,
        message_id: str | None = None,
        limit: int = 100,
    ) -> list[ArchivedMessage]:
        """Finished copies, newest first."""
        if subscription is not None:
            validate_topic(subscription, "subscription")
        try:
            chosen = None if outcome is None else Outcome(outcome)
        except ValueError:
            raise InvalidOption("outcome", f"must be one of {[o.value for o in Outcome]}") from None
        count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
        canonical = None if message_id is None else validate.message_id(message_id)
        return self._checked().archive_list(
            subscription=subscription, outcome=chosen, message_id=canonical, limit=count
        )

    def stats(self, *, window: float | timedelta = metrics.RATE_WINDOW) -> list[SubscriptionStats]:
        """Per subscription: ready, scheduled, running, blocked, dead, the oldest ready age,
        expired copies, and — from what workers recorded over the last ``window`` seconds —
        completed, retried and dead-lettered per minute and handler time p50/p95."""
        return metrics.subscription_stats(self._checked(), window=window)

    # --- observability -----------------------------------------------------------------------

    def workers(self) -> list[WorkerInfo]:
        """Worker processes as their heartbeats last reported them, most recent first."""
        return metrics.workers(self._checked())

    def metrics_series(self, *, minutes: int = 60) -> dict[str, list[SeriesPoint]]:
        """Per subscription, completed / retried / dead and handler p50/p95 for each of the
        last ``minutes`` minutes (the current one last)."""
        return metrics.series(self._checked(), minutes=minutes)

    def unrouted(self, *, window: float | timedelta = metrics.RATE_WINDOW) -> metrics.Unrouted:
        """Publishes that matched no subscription: in the archive, and within ``window``."""
        return metrics.unrouted(self._checked(), window=window)

    def audit(self, *, limit: int = 100, before_id: int | None = None) -> list[AuditEntry]:
        """Replays and purges of dead letters (who, when, which, why), newest first."""
        count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
        if before_id is not None:
            before_id = validate.integer(before_id, "before_id", minimum=1, maximum=2**63 - 1)
        return self._checked().audit_list(limit=count, before_id=before_id)

    # --- schedules ---------------------------------------------------------------------------

    def schedule(
        self,
        name: str,
        topic: str,
        payload: Any,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        missed: Missed | str = Missed.LATEST,
        grace: float | timedelta = DEFAULT_GRACE,
        start_at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        priority: int = NORMAL,
        key: str | None = None,
        ttl: float | timedelta | None = None,
        max_attempts: int | None = None,
        content_type: str | None = None,
    ) -> Schedule:
        """Publish ``payload`` to ``topic`` on a schedule: ``cron="0 3 * * *"`` (croniter,
        in the time zone ``tz``) or ``every=`` seconds or a timedelta. Durable: workers
        (or :meth:`run_due_schedules`) publish each tick exactly once, however many run.

        Upserts by ``name``: the same definition again changes nothing; the same timing
        with other options keeps the next run; a new timing recomputes it. ``start_at``:
        no tick before it (an interval's ticks count from it; without it the first is one
        interval from now). ``missed``: what to do with ticks that passed while nothing
        ran — ``"latest"`` (publish the most recent one), ``"skip"`` (none; a tick at most
        ``grace`` seconds late is on time, not missed) or ``"all"`` (each of them, at most
        1000 at once). Each tick's message carries the headers ``sqlbroker-schedule``
        (the name) and ``sqlbroker-tick`` (the tick's time, ISO 8601 in UTC), and the
        idempotency key ``schedule:<name>:<tick>``. The other options are as in
        :meth:`publish`. Everything is validated before anything is written.
        """
        return self._schedules.define(
            name,
            topic,
            payload,
            cron=cron,
            every=every,
            tz=tz,
            missed=missed,
            grace=grace,
            start_at=start_at,
            headers=headers,
            priority=priority,
            key=key,
            ttl=ttl,
            max_attempts=max_attempts,
            content_type=content_type,
        )

    def unschedule(self, name: str) -> bool:
        """Delete a schedule; return whether it existed. Messages it published stay."""
        return self._schedules.delete(name)

    def schedules(self, names: Iterable[str] | None = None) -> list[Schedule]:
        """Every schedule (or the named ones), by name, with its next and last run."""
        return self._schedules.list(names)

    def pause_schedule(self, name: str) -> bool:
        """Publish no ticks of ``name`` until :meth:`resume_schedule`; return whether it
        exists."""
        return self._schedules.pause(name)

    def resume_schedule(self, name: str) -> bool:
        """Resume a paused schedule from its first tick after now (ticks that fell while it
        was paused are not published); return whether it exists."""
        return self._schedules.resume(name)

    def run_due_schedules(self) -> ScheduleRun:
        """One scheduler pass: publish every due tick and advance the schedules. Workers
        run this on their own; call it from scripts, cron jobs or tests."""
        return self._schedules.run_due()
