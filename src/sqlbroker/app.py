"""The public faces, :class:`Broker` (blocking) and :class:`AsyncBroker` (coroutines): one
private base (:class:`~sqlbroker.client.base.BrokerBase`: configuration, subscribers and
every operation, written once) plus the worker runtime, composed here so that neither layer
imports the one above it. The faces have the same members with the same signatures; they
differ only in how an operation runs (a test compares them)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Self, TypedDict, TypeVar, Unpack

from sqlbroker.client.base import BrokerBase
from sqlbroker.client.consuming import worker_name
from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption, SqlbrokerError
from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.sagas import Saga
from sqlbroker.features.dead_letters import AsyncDeadLetters, DeadLetters
from sqlbroker.features.faces import (
    Awaiting,
    Blocking,
    Call,
    Plan,
    operation,
)
from sqlbroker.features.processed import AsyncOnce, Once
from sqlbroker.features.subscribers import DEFAULT_CONCURRENCY
from sqlbroker.runtime.events import WorkerObserver
from sqlbroker.runtime.sagas import saga_handler
from sqlbroker.runtime.worker import Worker, WorkerOptions

H = TypeVar("H", bound=Callable[..., Any])


class SagaStepOptions(TypedDict, total=False):
    """The options of :meth:`Broker.saga_step` and ``saga_compensation``, every one
    optional."""

    concurrency: int
    """Handlers of the step running at once per worker process (default 10)."""
    retry: RetryPolicy | None
    """The step's :class:`RetryPolicy` (default ``RetryPolicy()``)."""
    transactional: bool
    """A plain function that writes through ``ctx.conn`` inside the transaction that
    records its outcome, so its effect happens exactly once (default ``False``; see
    :mod:`sqlbroker.runtime.sagas`)."""


class RunOptions(WorkerOptions, total=False):
    """The keywords of :meth:`Broker.worker`, ``run`` and ``run_until_idle`` (and the
    same on :class:`AsyncBroker`), every one optional: which subscribers run, and how the
    worker runs (:class:`~sqlbroker.runtime.worker.WorkerOptions`, with their defaults)."""

    subscriptions: Sequence[str] | None
    """The subscribers to run, by subscription name (default: every registered one)."""
    concurrency: int | None
    """Handlers running at once per subscriber, for all of them (default: each
    subscriber's own)."""


class _Base(BrokerBase):
    """What both faces add to the base: sagas' handlers and the worker."""

    worker_name = staticmethod(worker_name)
    _worker: Worker | None = None
    """The worker :meth:`run` runs, while it does."""

    def add_observer(self, observer: WorkerObserver) -> None:
        """Subscribe ``observer`` to the lifecycle events of every worker this broker starts
        from now on (metrics, tracing and logging integrations use this)."""
        self._observers.append(observer)

    def saga_step(
        self, saga: Saga, step: str, **options: Unpack[SagaStepOptions]
    ) -> Callable[[H], H]:
        """Register the decorated function as the action of ``saga``'s ``step``: called
        with a :class:`~sqlbroker.runtime.sagas.StepContext`, it returns the step's output
        (JSON). It runs as the subscriber of the queue ``saga.<saga>.<step>`` with the
        step's timeout and the ``retry`` policy; on the attempt the policy would dead-letter
        (or ``Reject``) the saga turns back. Actions run at least once; see
        :mod:`sqlbroker.runtime.sagas` for ``transactional`` and ``broker.once``. The
        options, each optional, and their defaults: :class:`SagaStepOptions`."""
        return self._saga_handler(saga, step, options, undo=False)

    def saga_compensation(
        self, saga: Saga, step: str, **options: Unpack[SagaStepOptions]
    ) -> Callable[[H], H]:
        """Register the decorated function as the compensation of ``saga``'s ``step``
        (queue ``saga.<saga>.<step>.undo``); the context's ``outputs`` hold the step's own
        output. Failing for good marks the saga ``failed`` and dead-letters the message.
        The options are :meth:`saga_step`'s."""
        return self._saga_handler(saga, step, options, undo=True)

    def _saga_handler(
        self, saga: Saga, step: str, options: SagaStepOptions, *, undo: bool
    ) -> Callable[[H], H]:
        validate.known_options(options, SagaStepOptions.__optional_keys__, "saga step")
        retry, transactional = options.get("retry"), options.get("transactional", False)
        if not isinstance(saga, Saga):
            raise InvalidOption("saga", "must be a Saga")
        definition = saga.step(step)
        if undo and not definition.compensate:
            raise InvalidOption("step", f"step {step!r} of saga {saga.name!r} has no compensation")
        policy = retry if retry is not None else RetryPolicy()

        def register(function: H) -> H:
            handler = saga_handler(
                lambda: self.sagas,
                definition,
                function,
                undo=undo,
                transactional=transactional,
                retry=policy,
            )
            self.subscriber(
                queue=saga.queue(step, undo=undo),
                concurrency=options.get("concurrency", DEFAULT_CONCURRENCY),
                timeout=definition.timeout,
                retry=policy,
            )(handler)
            self._saga_definitions[saga.name] = saga
            return function

        return register

    def worker(self, **options: Unpack[RunOptions]) -> Worker:
        """A worker for all registered subscribers (or those ``subscriptions`` names). It
        also publishes the ticks of durable schedules unless ``schedules=False``. The
        options, each optional, and their defaults: :class:`RunOptions`."""
        subscriptions = options.pop("subscriptions", None)
        concurrency = options.pop("concurrency", None)
        chosen = list(self.subscribers) if subscriptions is None else list(subscriptions)
        unknown = [name for name in chosen if name not in self.subscribers]
        if unknown:
            known = ", ".join(self.subscribers) or "none"
            raise SqlbrokerError(f"no subscriber named {', '.join(unknown)} (registered: {known})")
        specs = [self.subscribers[name] for name in chosen]
        if concurrency is not None:
            slots = validate.integer(concurrency, "concurrency", minimum=1, maximum=10_000)
            specs = [dataclasses.replace(spec, concurrency=slots) for spec in specs]
        settings: WorkerOptions = options
        sagas = [s for s in self._saga_definitions.values() if set(s.queues()) & set(chosen)]
        return Worker(self, specs, observers=self._observers, sagas=sagas, **settings)

    # Not checked by the face: the worker checks the schema itself, on its loop and inside
    # its teardown, so that a failed check lets go of what it opened.
    @functools.partial(operation, checked=False)
    def run(self, *, timeout: float | None = None, **options: Unpack[RunOptions]) -> Plan[None]:
        """Run the subscribers until stopped (``stop()``, SIGTERM or SIGINT, or
        ``timeout`` seconds): blocking on ``Broker``, on the caller's loop on
        ``AsyncBroker``. The options are :meth:`worker`'s (:class:`RunOptions`)."""
        yield from self._running(self.worker(**options), until_idle=False, timeout=timeout)

    @functools.partial(operation, checked=False)
    def run_until_idle(
        self, *, timeout: float | None = None, **options: Unpack[RunOptions]
    ) -> Plan[None]:
        """Run until the subscriptions have no ready, scheduled or running messages left
        (or ``timeout`` seconds pass). For scripts and tests. The options are
        :meth:`worker`'s, but ``install_signal_handlers`` defaults to ``False``."""
        options.setdefault("install_signal_handlers", False)
        yield from self._running(self.worker(**options), until_idle=True, timeout=timeout)

    def _running(self, worker: Worker, *, until_idle: bool, timeout: float | None) -> Plan[None]:
        """The plan that runs ``worker``: on its own loop for the blocking face, on the
        caller's for the other; the publish listener and ``stop()`` see it until it ends.
        It exists before its loop does, so that a stop() from another thread right after
        starting is remembered rather than lost."""
        run = functools.partial(worker.run, until_idle=until_idle, timeout=timeout)
        run_async = functools.partial(worker.run_async, until_idle=until_idle, timeout=timeout)
        self._worker = worker
        self.add_publish_listener(worker.hint)
        try:
            yield Call("run", blocking=run, awaiting=run_async)
        finally:
            self.remove_publish_listener(worker.hint)
            self._worker = None

    def stop(self, *, now: bool = False) -> None:
        """Stop a running worker gracefully (or at once); safe from any thread or handler."""
        if self._worker is not None:
            self._worker.stop(now=now)


class Broker(_Base, Blocking):
    """A message broker in your database: publish, consume, administer; each call returns
    its result. :class:`AsyncBroker` has the same members as coroutines.

    Declare consumers with :meth:`subscriber` and run them with :meth:`run`,
    :meth:`run_until_idle` (scripts and tests) or the ``sqlbroker worker module:broker``
    command. Several worker processes on one database share the work.
    """

    _dead_letters = DeadLetters
    dead_letters: DeadLetters

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
        default = self._defaults.dedupe_window
        return Once(self, scope, key, lease=lease, window=default if window is None else window)

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


class AsyncBroker(_Base, Awaiting):
    """The awaitable face: the same members as :class:`Broker`, each operation a coroutine
    on the caller's event loop. On PostgreSQL it runs on psycopg's ``AsyncConnection``
    (a pool per event loop), with no thread per call; SQLite has no async driver, so its
    operations run on the backend's own thread.

    ``async with AsyncBroker(url) as broker:`` closes the loop's connections when the
    block ends (or ``await broker.close()``). Used from one ``asyncio.run()`` after another
    without closing, a loop's connections are closed when the next loop first uses the
    broker (and by ``close()``): they never pile up.
    """

    _dead_letters = AsyncDeadLetters
    dead_letters: AsyncDeadLetters

    def once(
        self,
        scope: str,
        key: str | int,
        *,
        lease: float | timedelta | None = None,
        window: float | timedelta | None = None,
    ) -> AsyncOnce:
        """``async with broker.once(scope, key) as first:``; see :meth:`Broker.once`."""
        default = self._defaults.dedupe_window
        return AsyncOnce(
            self, scope, key, lease=lease, window=default if window is None else window
        )

    async def close(self) -> None:
        """Close the broker's connections; ``async with AsyncBroker(...)`` calls it. The
        running loop's are closed on the loop; what would block (the blocking pool,
        SQLite's files) on the backend's own threads, never the loop's default executor."""
        await self._backend.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()
