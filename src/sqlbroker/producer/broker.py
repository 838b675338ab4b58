"""The synchronous ``Broker``: publishing, subscriptions, maintenance and processed keys.

The low-level consumer API (:mod:`.consuming`), the listings and stats (:mod:`.inspection`)
and the schedules (:mod:`.scheduling`) are mixed in from their own modules."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self

from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import InvalidOption, SchemaError
from sqlbroker.core.flow import Flow
from sqlbroker.core.limits import (
    DEFAULT_MAX_COPIES,
    DEFAULT_MAX_PATTERNS,
    DEFAULT_MAX_SUBSCRIPTIONS,
    PATTERNS_PER_SUBSCRIPTION,
    Limits,
)
from sqlbroker.core.message import (
    NORMAL,
    NewMessage,
    Retention,
    Subscription,
)
from sqlbroker.core.results import Result
from sqlbroker.core.serde import DEFAULT_PAYLOAD_LIMIT, check_payload_limit
from sqlbroker.core.topics import validate_pattern, validate_topic
from sqlbroker.features.dead_letters import DeadLetters, default_actor
from sqlbroker.features.flow import flow_change, flow_list
from sqlbroker.features.processed import Once, make_once, processed_key
from sqlbroker.features.publishing import (
    PublishDefaults,
    build_batch,
    build_message,
    check_options,
    with_headers,
)
from sqlbroker.features.results import DEFAULT_RESULT_TTL, Results, check_result_ttl
from sqlbroker.features.retention import (
    DEFAULT_ARCHIVE_RETENTION,
    DEFAULT_DEAD_RETENTION,
    RetentionDefaults,
    retain,
    retention_list,
    retention_set,
)
from sqlbroker.features.sagas import Sagas
from sqlbroker.features.schedules import Schedules
from sqlbroker.producer.consuming import BrokerConsumer
from sqlbroker.producer.inspection import BrokerInspection
from sqlbroker.producer.scheduling import BrokerSchedules
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.base import ReapResult
from sqlbroker.storage.factory import open_backend
from sqlbroker.storage.url import parse_url

DEFAULT_URL = "sqlite:///sqlbroker.db"
DEFAULT_LEASE = 30.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_DEDUPE_WINDOW = 24 * 3600.0


class Broker(BrokerConsumer, BrokerInspection, BrokerSchedules):
    """A message broker in your database.

    ``Broker("sqlite:///app.db")`` or ``Broker("postgresql://…")``. On SQLite the schema is
    created (or upgraded) here, so that the first publish may join the caller's open
    transaction; on PostgreSQL run :meth:`migrate` (or ``sqlbroker migrate``) once,
    with a role allowed to create tables, or pass ``migrate=True``.

    Every duration takes seconds or a :class:`datetime.timedelta`. Bad arguments raise a
    ``ValidationError`` subclass before anything is written.

    ``result_ttl`` (default one day) is how long a handler's stored return value is kept
    (:meth:`result`; the reaper trims older ones).

    Limits (docs/guarantees.md, "Limits"; passing one raises ``LimitExceeded`` naming it and
    writes nothing): ``max_copies`` (10,000), the copies one publish call may write —
    messages times the subscriptions each fans out to; ``max_subscriptions`` (10,000) and
    ``max_patterns`` (10,000) per database. A subscription has at most 100 patterns.

    Retention (docs/reliability.md, "Retention"): finished copies are kept in the archive
    for ``archive_retention`` (7 days) and dead letters for ``dead_retention`` (30 days),
    unless a subscription has times of its own (:meth:`set_retention`); the reaper removes
    what is older.
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
        max_copies: int = DEFAULT_MAX_COPIES,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        max_patterns: int = DEFAULT_MAX_PATTERNS,
        result_ttl: float | timedelta = DEFAULT_RESULT_TTL,
        archive_retention: float | timedelta = DEFAULT_ARCHIVE_RETENTION,
        dead_retention: float | timedelta = DEFAULT_DEAD_RETENTION,
        clock: Clock | None = None,
        **backend_options: Any,
    ) -> None:
        parsed = parse_url(url)
        self._retention = RetentionDefaults.checked(archive=archive_retention, dead=dead_retention)
        self._url = parsed
        self._lease = validate.lease_seconds(lease)
        self._result_ttl = check_result_ttl(result_ttl)
        self._defaults = PublishDefaults(
            max_attempts=validate.integer(
                max_attempts, "max_attempts", minimum=1, maximum=validate.MAX_ATTEMPTS
            ),
            dedupe_window=validate.seconds(dedupe_window, "dedupe_window", allow_zero=False),
            payload_limit=check_payload_limit(payload_limit),
        )
        self._migrate = parsed.scheme == "sqlite" if migrate is None else bool(migrate)
        if "limits" in backend_options:
            raise InvalidOption("limits", "pass max_copies, max_subscriptions, max_patterns")
        self._limits = limits = Limits.checked(
            max_copies=max_copies, max_subscriptions=max_subscriptions, max_patterns=max_patterns
        )
        self._clock = clock
        self._backend: Backend = open_backend(url, clock=clock, limits=limits, **backend_options)
        self._ready = False
        self._ready_lock = threading.Lock()
        if self._migrate and parsed.scheme == "sqlite":
            # Now, not on first use: that may be a publish inside the caller's open
            # transaction (the outbox), whose write lock a migration would wait for.
            try:
                self._checked()
            except BaseException:
                self._backend.close()
                raise
        self.dead_letters = DeadLetters(self._checked)
        self._results = Results(self._checked, ttl=self._result_ttl)
        self._schedules = Schedules(self._checked, self._defaults)
        self._sagas_checked: set[str] = set()
        """Sagas whose handlers the first start checked (see ``Sagas``)."""
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
        """Stop calling a listener added by :meth:`add_publish_listener` (unknown: no-op)."""
        with contextlib.suppress(ValueError):
            self._publish_listeners.remove(listener)

    def with_hook_headers(self, messages: list[NewMessage]) -> list[NewMessage]:
        """``messages`` with the headers of the hooks (:meth:`add_header_hook`) added: every
        publish path calls this on the caller's thread, where a trace span is current."""
        return with_headers(messages, self._header_hooks) if self._header_hooks else messages

    def insert(self, messages: list[NewMessage], queue: str | None) -> list[str]:
        """Publish built messages (``AsyncBroker``'s publishes run this on its threads)."""
        return self._insert(messages, queue, None)

    def _insert(self, messages: list[NewMessage], queue: str | None, conn: Any) -> list[str]:
        messages = self.with_hook_headers(messages)
        backend = self._checked()
        max_copies = self._limits.max_copies
        if conn is not None:
            with backend.begin(conn) as tx:
                joined = tx.message_insert_many(
                    messages=messages, subscription=queue, max_copies=max_copies
                )
            return joined.message_ids
        result = backend.message_insert_many(
            messages=messages, subscription=queue, max_copies=max_copies
        )
        self.published(queue)
        return result.message_ids

    def published(self, queue: str | None) -> None:
        """Tell the publish listeners that a publish committed. With ``conn=`` the caller
        has not committed yet: NOTIFY or the change watcher tells the workers once it does."""
        for listener in list(self._publish_listeners):
            listener(queue)

    def ready_backend(self) -> Backend | None:
        """The backend once its schema was checked (the first use may migrate), else None."""
        return self._backend if self._ready else None

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
    def limits(self) -> Limits:
        """The limits every publish and subscribe is checked against (``max_copies``, …)."""
        return self._limits

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
        """Whether the database is SQLite's ``:memory:`` one (gone when the broker closes)."""
        return self._url.path == ":memory:"

    def __repr__(self) -> str:
        return f"Broker({str(self._url)!r})"

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
        """The database's applied schema version (0 for an empty database)."""
        return self._backend.schema_version()

    def close(self) -> None:
        """Close the broker's connections; ``with Broker(...) as broker:`` calls it."""
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

        ``delay``/``ttl`` count from the database's now, ``at``/``expires_at`` are
        absolute. A message that would expire before it becomes available is refused
        (``delay`` ≥ ``ttl``, ``at`` ≥ ``expires_at``); a mix of the two kinds (``at`` with
        ``ttl``, ``delay`` with ``expires_at``) cannot be compared before the database's
        clock is read, and such a message expires undelivered if its expiry comes first.
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
        replace = validate.flag(replace, "replace")
        pattern_list = (
            [patterns]
            if isinstance(patterns, str)
            else validate.items(patterns, "patterns", "patterns")
        )
        if not pattern_list:
            raise InvalidOption("patterns", "give at least one pattern")
        if len(pattern_list) > PATTERNS_PER_SUBSCRIPTION:
            raise InvalidOption(
                "patterns", f"a subscription has at most {PATTERNS_PER_SUBSCRIPTION} patterns"
            )
        checked = [validate_pattern(pattern, "patterns") for pattern in pattern_list]
        return self._checked().subscription_upsert(name=name, patterns=checked, replace=replace)

    def unsubscribe(self, name: str) -> bool:
        """Delete a subscription and its pending messages (dead letters and archive stay)."""
        validate_topic(name, "name")
        return self._checked().subscription_delete(name=name)

    def subscriptions(self) -> list[Subscription]:
        """Every subscription, with its patterns (:class:`~sqlbroker.Subscription`)."""
        return self._checked().subscription_list()

    def pause(self, name: str, *, actor: str | None = None, note: str | None = None) -> None:
        """Stop claims on subscription ``name`` until :meth:`resume`, for every worker and
        across restarts: publishes are still accepted, running handlers finish. Recorded in
        the audit trail (``actor`` defaults to ``api:<user>``); ``NotFound`` for an
        unknown subscription."""
        self._set_paused(name, True, actor, note)

    def resume(self, name: str, *, actor: str | None = None, note: str | None = None) -> None:
        """Let workers claim from ``name`` again (see :meth:`pause`)."""
        self._set_paused(name, False, actor, note)

    def _set_paused(self, name: str, paused: bool, actor: str | None, note: str | None) -> None:
        validate_topic(name, "name")
        self._checked().subscription_pause(
            name=name,
            paused=paused,
            actor=default_actor() if actor is None else validate.reason(actor, "actor")[:200],
            note=None if note is None else validate.reason(note, "note"),
        )

    def flow(self, subscription: str | None = None) -> list[Flow]:
        """Each subscription's (or one's) flow limits — concurrency caps, rate limits,
        fairness — with its running copies and whether claims wait now (``throttled``).
        See docs/flow-control.md."""
        return flow_list(self._checked(), subscription)

    def set_flow(self, subscription: str, *, reset: bool = False, **limits: object) -> Flow:
        """Change a subscription's flow limits for every worker and host: ``max_running``,
        ``key_concurrency`` (integers from 1), ``rate_limit``, ``key_rate_limit``
        (``"100/min"``, ``"5/s"`` or a :class:`Rate`), ``fair`` (bool). A limit given as
        ``None`` is removed; those not named stay (``reset=True``: are removed). Bad values
        and unknown names raise ``ValidationError`` before anything is written;
        ``NotFound`` for an unknown subscription."""
        return flow_change(self._checked(), subscription, limits, reset=reset)

    # --- results -----------------------------------------------------------------------------

    def result(
        self,
        message_id: str,
        *,
        wait: float | timedelta = 0.0,
        subscription: str | None = None,
    ) -> Result | None:
        """The result of the message's copy: what its handler returned (``value``), or the
        error of a dead-lettered copy, or how it otherwise finished (docs/results.md).

        Returns ``None`` while the copy is not finished — after waiting up to ``wait``
        seconds for it, woken by a notification (PostgreSQL) or the change watcher
        (SQLite). A message fanned out to several subscriptions has one result per copy:
        name one with ``subscription`` (``InvalidOption`` lists them otherwise). An unknown
        message, or one whose records are gone, raises ``NotFound``. Values are kept for
        the broker's ``result_ttl``."""
        return self._results.get(message_id, wait=wait, subscription=subscription)

    def _result_limit(self) -> int:
        return self._defaults.payload_limit

    @property
    def result_ttl(self) -> float:
        """How long stored results are kept, in seconds."""
        return self._result_ttl

    def retention(self, subscription: str | None = None) -> list[Retention]:
        """How long each subscription (or one) keeps its archive rows and dead letters: its
        own times or the broker's defaults."""
        return retention_list(self._checked(), self._retention, subscription)

    def set_retention(
        self,
        subscription: str,
        *,
        archive: float | timedelta | None = None,
        dead: float | timedelta | None = None,
        reset: bool = False,
    ) -> Retention:
        """Give a subscription its own archive and/or dead-letter retention (``None``: leave
        it as it is; ``reset=True`` first returns both to the broker's defaults). Raises
        ``NotFound`` when there is no such subscription."""
        return retention_set(
            self._checked(), self._retention, subscription, archive=archive, dead=dead, reset=reset
        )

    # --- maintenance -------------------------------------------------------------------------

    def reap(self, *, limit: int = 1000) -> dict[str, int]:
        """One maintenance pass (the worker runs this periodically): release expired leases,
        dead-letter copies whose attempts are spent, expire TTLs, trim idempotency keys and
        processed keys past their window, stored results older than ``result_ttl`` and
        expired Celery results, and remove archive rows and dead letters past their
        retention (at most ``limit`` of each kind per pass)."""
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
            "results_trimmed": backend.result_trim(ttl=self._result_ttl, limit=count)
            + backend.task_result_trim(limit=count),
            "sagas_swept": self.sagas.sweep(limit=count),
            **retain(backend, self._retention, limit=count),
        }

    # --- sagas -------------------------------------------------------------------------------

    @property
    def sagas(self) -> Sagas:
        """Start, cancel and read sagas (``broker.sagas.start(saga, data)``); see
        :mod:`sqlbroker.features.sagas`. Steps are handled by the app ``Broker``'s
        ``saga_step`` and ``saga_compensation`` subscribers."""
        return Sagas(
            self._checked(),
            self._defaults,
            handled=self._handled_queues,
            checked=self._sagas_checked,
        )

    def _handled_queues(self) -> Collection[str]:
        """The subscriptions this process has handlers for (the app ``Broker``'s)."""
        return ()

    # --- processed keys ----------------------------------------------------------------------

    def once(
        self,
        scope: str,
        key: str | int,
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

    def forget(self, scope: str, key: str | int) -> bool:
        """Delete a processed key whatever its state, so its effect may run again."""
        validate_topic(scope, "scope")
        return self._checked().processed_forget(scope=scope, key=processed_key(key))
