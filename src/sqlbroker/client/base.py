"""The private base of :class:`~sqlbroker.Broker` and :class:`~sqlbroker.AsyncBroker`:
configuration, the subscriber registry and every operation, each written once as a plan
(:mod:`sqlbroker.features.faces`) in :mod:`.publishing`, :mod:`.consuming`,
:mod:`.inspection` and :mod:`.scheduling`. The faces add only how a plan runs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, Unpack

from sqlbroker.client import consuming, inspection, publishing, scheduling
from sqlbroker.core import validate
from sqlbroker.core.clock import Clock
from sqlbroker.core.errors import InvalidOption, SchemaError, SqlbrokerError
from sqlbroker.core.limits import (
    DEFAULT_MAX_COPIES,
    DEFAULT_MAX_PATTERNS,
    DEFAULT_MAX_SUBSCRIPTIONS,
    Limits,
)
from sqlbroker.core.sagas import Saga
from sqlbroker.core.serde import DEFAULT_PAYLOAD_LIMIT, check_payload_limit
from sqlbroker.features.dead_letters import DeadLettersBase
from sqlbroker.features.faces import Face, operation
from sqlbroker.features.publishing import PublishDefaults
from sqlbroker.features.results import DEFAULT_RESULT_TTL, Results, check_result_ttl
from sqlbroker.features.retention import (
    DEFAULT_ARCHIVE_RETENTION,
    DEFAULT_DEAD_RETENTION,
    RetentionDefaults,
)
from sqlbroker.features.sagas import Sagas
from sqlbroker.features.subscribers import SubscriberOptions, SubscriberSpec, make_spec
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.factory import open_backend
from sqlbroker.storage.url import parse_url

DEFAULT_URL = "sqlite:///sqlbroker.db"
DEFAULT_LEASE = 30.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_DEDUPE_WINDOW = 24 * 3600.0
H = TypeVar("H", bound=Callable[..., Any])


class BrokerBase(Face):
    """A message broker in your database (the two faces' shared base).

    ``Broker("sqlite:///app.db")`` or ``Broker("postgresql://…")``. On SQLite the schema is
    created (or upgraded) here, so that the first publish may join the caller's open
    transaction; on PostgreSQL run :meth:`migrate` (or ``sqlbroker migrate``) once,
    with a role allowed to create tables, or pass ``migrate=True`` (the first operation
    then migrates).

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
        self._url = parse_url(url)
        self._retention = RetentionDefaults.checked(archive=archive_retention, dead=dead_retention)
        self._lease = validate.lease_seconds(lease)
        self._result_ttl = check_result_ttl(result_ttl)
        self._defaults = PublishDefaults(
            max_attempts=validate.integer(
                max_attempts, "max_attempts", minimum=1, maximum=validate.MAX_ATTEMPTS
            ),
            dedupe_window=validate.seconds(dedupe_window, "dedupe_window", allow_zero=False),
            payload_limit=check_payload_limit(payload_limit),
        )
        self._migrate = self._url.scheme == "sqlite" if migrate is None else bool(migrate)
        if "limits" in backend_options:
            raise InvalidOption("limits", "pass max_copies, max_subscriptions, max_patterns")
        self._limits = limits = Limits.checked(
            max_copies=max_copies, max_subscriptions=max_subscriptions, max_patterns=max_patterns
        )
        self._clock = clock
        self._backend: Backend = open_backend(url, clock=clock, limits=limits, **backend_options)
        self._is_ready = False
        self._ready_lock = threading.Lock()
        if self._migrate and self._url.scheme == "sqlite":
            # Now, not on first use: that may be a publish inside the caller's open
            # transaction (the outbox), whose write lock a migration would wait for.
            try:
                self._ready()
            except BaseException:
                self._backend.close()
                raise
        self._results = Results(ttl=self._result_ttl)
        self._sagas_checked: set[str] = set()
        """Sagas whose handlers the first start checked (see ``Sagas``)."""
        self._publish_listeners: list[Callable[[str | None], None]] = []
        self._header_hooks: list[Callable[[], Mapping[str, str]]] = []
        self._taken_back_at: float | None = None
        """When a claim last swept expired leases (the clock's time, or monotonic)."""
        self.subscribers: dict[str, SubscriberSpec] = {}
        """The handlers :meth:`subscriber` registered, by subscription name."""
        self._saga_definitions: dict[str, Saga] = {}
        self._observers: list[Any] = []
        """The worker observers (``add_observer``), for every worker started from now on."""
        self.dead_letters = self._dead_letters(self)
        """List, show, replay and purge dead letters."""

    _dead_letters: Callable[[BrokerBase], DeadLettersBase]
    """The face's kind of :class:`DeadLettersBase`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._url)!r})"

    # --- the schema, checked before the first operation -----------------------------------

    def _ready(self) -> Backend:
        if not self._is_ready:
            with self._ready_lock:
                if not self._is_ready:
                    # Read the version first: a migration takes the write lock, which a
                    # caller's open transaction (conn=) may hold on SQLite.
                    if self._migrate:
                        try:
                            self._backend.check_schema()
                        except SchemaError:
                            self._backend.migrate()
                    self._backend.check_schema()
                    self._is_ready = True
        return self._backend

    async def _ready_async(self) -> Backend:
        """:meth:`_ready` on the running loop: the version read by a coroutine; a
        migration (the runners are blocking) by :meth:`_ready` on the backend's own
        threads, once however many coroutines ask. A check that fails lets go of what
        it opened for the running loop: its caller (``asyncio.run`` of one call) may
        never come back to that loop."""
        if self._is_ready:
            return self._backend
        backend = self._backend
        try:
            try:
                backend.schema_files.check(await backend.async_ops.schema_version())
            except SchemaError:
                if not self._migrate:
                    raise
                await backend.offload(self._ready)
        except Exception:
            with contextlib.suppress(Exception):  # the check's error is the one to raise
                await backend.close_async()
            raise
        self._is_ready = True
        return backend

    # --- configuration (plain reads: no property runs anything) ---------------------------

    @property
    def url(self) -> str:
        """The database URL with any password replaced by ``***``."""
        return str(self._url)

    @property
    def backend(self) -> Backend:
        """The storage backend (for the runtime and advanced use); its schema is checked
        (or migrated, with ``migrate=True``) by the first operation, not here."""
        return self._backend

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
    def result_ttl(self) -> float:
        """How long stored results are kept, in seconds."""
        return self._result_ttl

    @property
    def sagas(self) -> Sagas:
        """Start, cancel and read sagas (``broker.sagas.start(saga, data)``; blocking on
        both faces); see :mod:`sqlbroker.features.sagas`. Steps are handled by the
        :meth:`saga_step` and :meth:`saga_compensation` subscribers."""
        return Sagas(
            self._ready,
            self._defaults,
            handled=self.subscribers.keys,
            checked=self._sagas_checked,
        )

    # --- hooks ---------------------------------------------------------------------------

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

    # --- subscribers ---------------------------------------------------------------------

    def subscriber(
        self, name: str | None = None, **options: Unpack[SubscriberOptions]
    ) -> Callable[[H], H]:
        """Register the decorated function (``async def`` or plain ``def``) as the handler
        of a subscription: ``topics=[patterns]`` for pub/sub (named ``name``, default the
        function's name) or ``queue=name`` for point-to-point. The options (``concurrency``,
        ``prefetch``, ``lease``, ``timeout``, ``retry``, ``ack``, ``on_dead_letter`` and the
        flow limits), each optional, and their defaults: :class:`SubscriberOptions`.
        """

        def register(handler: H) -> H:
            spec = make_spec(handler, name=name, **options)
            if spec.name in self.subscribers:
                raise SqlbrokerError(f"a subscriber for {spec.name!r} is already registered")
            self.subscribers[spec.name] = spec
            return handler

        return register

    # --- the operations, each written once (see the modules for their contracts) ---------

    migrate = operation(inspection.migrate, checked=False)
    schema_version = operation(inspection.schema_version, checked=False)

    publish = operation(publishing.publish)
    publish_many = operation(publishing.publish_many)
    send = operation(publishing.send)
    send_many = operation(publishing.send_many)
    subscribe = operation(publishing.subscribe)
    unsubscribe = operation(publishing.unsubscribe)
    subscriptions = operation(publishing.subscriptions)
    pause = operation(publishing.pause)
    resume = operation(publishing.resume)
    forget = operation(publishing.forget)

    claim = operation(consuming.claim)
    complete = operation(consuming.complete)
    retry = operation(consuming.retry)
    dead_letter = operation(consuming.dead_letter)
    extend = operation(consuming.extend)
    release = operation(consuming.release)
    cancel = operation(consuming.cancel)

    pending = operation(inspection.pending)
    archive = operation(inspection.archive)
    stats = operation(inspection.stats)
    workers = operation(inspection.workers)
    metrics_series = operation(inspection.metrics_series)
    unrouted = operation(inspection.unrouted)
    audit = operation(inspection.audit)
    retention = operation(inspection.retention)
    set_retention = operation(inspection.set_retention)
    flow = operation(inspection.flow)
    set_flow = operation(inspection.set_flow)
    reap = operation(inspection.reap)
    result = operation(inspection.result)

    schedule = operation(scheduling.schedule)
    unschedule = operation(scheduling.unschedule)
    schedules = operation(scheduling.schedules)
    pause_schedule = operation(scheduling.pause_schedule)
    resume_schedule = operation(scheduling.resume_schedule)
    run_due_schedules = operation(scheduling.run_due_schedules)

    # --- used by the plans -----------------------------------------------------------------

    def _published(self, queue: str | None) -> None:
        """Tell the publish listeners that a publish committed. With ``conn=`` the caller
        has not committed yet: NOTIFY or the change watcher tells the workers once it does."""
        for listener in list(self._publish_listeners):
            listener(queue)
