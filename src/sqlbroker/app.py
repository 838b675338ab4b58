"""The public ``Broker``: publishing and administration (L2) plus subscribers and the
worker runtime (L3), composed here so that neither layer imports the one above it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption, SqlbrokerError
from sqlbroker.core.flow import Rate
from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.sagas import Saga
from sqlbroker.features.sagas import warn_unhandled
from sqlbroker.features.subscribers import (
    DEFAULT_CONCURRENCY,
    DEFAULT_TIMEOUT,
    AckMode,
    DeadLetterHook,
    SubscriberSpec,
    make_spec,
)
from sqlbroker.producer.broker import Broker as _ProducerBroker
from sqlbroker.runtime.events import WorkerObserver
from sqlbroker.runtime.heartbeat import DEFAULT_HEARTBEAT
from sqlbroker.runtime.sagas import saga_handler
from sqlbroker.runtime.worker import Worker

H = TypeVar("H", bound=Callable[..., Any])


class Broker(_ProducerBroker):
    """A message broker in your database: publish, consume, administer.

    Declare consumers with :meth:`subscriber` and run them with :meth:`run` (blocking),
    :meth:`run_async`, :meth:`run_until_idle` (scripts and tests) or the ``sqlbroker
    worker module:broker`` command. Several worker processes on one database share the work.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subscribers: dict[str, SubscriberSpec] = {}
        self._saga_definitions: dict[str, Saga] = {}
        self._worker: Worker | None = None
        self._observers: list[WorkerObserver] = []

    def _handled_queues(self) -> Collection[str]:
        return self.subscribers.keys()

    def add_observer(self, observer: WorkerObserver) -> None:
        """Subscribe ``observer`` to the lifecycle events of every worker this broker starts
        from now on (metrics, tracing and logging integrations use this)."""
        self._observers.append(observer)

    def subscriber(
        self,
        name: str | None = None,
        *,
        topics: Sequence[str] | str | None = None,
        queue: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        prefetch: int | None = None,
        lease: float | timedelta | None = None,
        timeout: float | timedelta | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        ack: AckMode = "auto",
        on_dead_letter: DeadLetterHook | None = None,
        max_running: int | None = None,
        key_concurrency: int | None = None,
        rate_limit: str | Rate | None = None,
        key_rate_limit: str | Rate | None = None,
        fair: bool | None = None,
    ) -> Callable[[H], H]:
        """Register the decorated function (``async def`` or plain ``def``) as the handler
        of a subscription: ``topics=[patterns]`` for pub/sub (named ``name``, default the
        function's name) or ``queue=name`` for point-to-point.

        - ``concurrency``: handlers running at once in each worker process (plain functions
          run in a thread pool, never on the event loop);
        - ``prefetch``: extra messages claimed ahead of free slots, so that the next batch
          is at hand when handlers finish. By default the worker sizes it from the handler's
          recent run time: as many as finish within about 50 ms on the free slots, at least
          the concurrency and at most 100, so fast handlers get one claim per batch and slow
          ones hold no more leases than they can start soon;
        - ``lease``: seconds a claim is held before redelivery (kept alive while running);
        - ``timeout``: a handler running longer is cancelled and counts as failed
          (default 300 s; ``None`` for no limit);
        - ``retry``: a :class:`RetryPolicy` (default: the message's max attempts, 1 s
          exponential backoff with full jitter, capped at 300 s);
        - ``ack``: ``"auto"`` settles from the handler's result; ``"manual"`` leaves it to
          ``msg.ack()``, ``msg.nack(after=…)`` or ``msg.reject(reason)``;
        - ``on_dead_letter(msg, reason)``: called after a message was dead-lettered;
        - flow limits, for the subscription as a whole across every worker and host
          (docs/flow-control.md): ``max_running`` copies running at once,
          ``key_concurrency`` per ordering key, ``rate_limit`` / ``key_rate_limit`` claims
          per period (``"100/min"``), ``fair`` round-robin across ordering keys. When any
          is given the worker sets exactly these at start (the others off); with none it
          leaves the subscription's own (``Broker.set_flow``, ``sqlbroker flow``).
        """

        def register(handler: H) -> H:
            spec = make_spec(
                handler,
                name=name,
                topics=topics,
                queue=queue,
                concurrency=concurrency,
                prefetch=prefetch,
                lease=lease,
                timeout=timeout,
                retry=retry,
                ack=ack,
                on_dead_letter=on_dead_letter,
                max_running=max_running,
                key_concurrency=key_concurrency,
                rate_limit=rate_limit,
                key_rate_limit=key_rate_limit,
                fair=fair,
            )
            if spec.name in self.subscribers:
                raise SqlbrokerError(f"a subscriber for {spec.name!r} is already registered")
            self.subscribers[spec.name] = spec
            return handler

        return register

    def saga_step(
        self,
        saga: Saga,
        step: str,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        retry: RetryPolicy | None = None,
        transactional: bool = False,
    ) -> Callable[[H], H]:
        """Register the decorated function as the action of ``saga``'s ``step``: called
        with a :class:`~sqlbroker.runtime.sagas.StepContext`, it returns the step's output
        (JSON). It runs as the subscriber of the queue ``saga.<saga>.<step>`` with the
        step's timeout and the ``retry`` policy; on the attempt the policy would dead-letter
        (or ``Reject``) the saga turns back. Actions run at least once; see
        :mod:`sqlbroker.runtime.sagas` for ``transactional`` and ``broker.once``."""
        return self._saga_handler(saga, step, concurrency, retry, transactional, undo=False)

    def saga_compensation(
        self,
        saga: Saga,
        step: str,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        retry: RetryPolicy | None = None,
        transactional: bool = False,
    ) -> Callable[[H], H]:
        """Register the decorated function as the compensation of ``saga``'s ``step``
        (queue ``saga.<saga>.<step>.undo``); the context's ``outputs`` hold the step's own
        output. Failing for good marks the saga ``failed`` and dead-letters the message."""
        return self._saga_handler(saga, step, concurrency, retry, transactional, undo=True)

    def _saga_handler(
        self,
        saga: Saga,
        step: str,
        concurrency: int,
        retry: RetryPolicy | None,
        transactional: bool,
        *,
        undo: bool,
    ) -> Callable[[H], H]:
        if not isinstance(saga, Saga):
            raise InvalidOption("saga", "must be a Saga")
        definition = saga.step(step)
        if undo and not definition.compensate:
            raise InvalidOption("step", f"step {step!r} of saga {saga.name!r} has no compensation")
        policy = retry if retry is not None else RetryPolicy()

        def register(function: H) -> H:
            handler = saga_handler(
                lambda: self.sagas,
                saga,
                definition,
                function,
                undo=undo,
                transactional=transactional,
                retry=policy,
            )
            self.subscriber(
                queue=saga.queue(step, undo=undo),
                concurrency=concurrency,
                timeout=definition.timeout,
                retry=policy,
            )(handler)
            self._saga_definitions[saga.name] = saga
            return function

        return register

    def worker(
        self,
        *,
        subscriptions: Sequence[str] | None = None,
        concurrency: int | None = None,
        grace: float = 30.0,
        reap_interval: float = 5.0,
        poll_interval: float = 1.0,
        install_signal_handlers: bool = True,
        heartbeat_interval: float = DEFAULT_HEARTBEAT,
        schedules: bool = True,
        listen: bool = True,
        write_batch: int = 500,
        write_backlog: int = 5000,
    ) -> Worker:
        """A worker for all registered subscribers (or the named ones). It also publishes
        the ticks of durable schedules unless ``schedules=False``. ``listen=False`` opens no
        wake-up listener (PostgreSQL's LISTEN connection, which a transaction-pooling proxy
        such as PgBouncer cannot carry; SQLite's commit watcher): other processes' messages
        are then found by the poll alone, within ``poll_interval`` seconds.

        Outcomes are written back ``write_batch`` per database call; at most
        ``write_backlog`` outcomes and unsettled claims are held at once (a slow database
        pauses the claims instead of growing memory)."""
        chosen = list(self.subscribers) if subscriptions is None else list(subscriptions)
        unknown = [name for name in chosen if name not in self.subscribers]
        if unknown:
            known = ", ".join(self.subscribers) or "none"
            raise SqlbrokerError(f"no subscriber named {', '.join(unknown)} (registered: {known})")
        specs = [self.subscribers[name] for name in chosen]
        for saga in self._saga_definitions.values():
            if any(queue in chosen for queue in saga.queues()):
                warn_unhandled(self.backend, saga, self.subscribers, when="this worker runs")
        if concurrency is not None:
            slots = validate.integer(concurrency, "concurrency", minimum=1, maximum=10_000)
            specs = [dataclasses.replace(spec, concurrency=slots) for spec in specs]
        return Worker(
            self,
            specs,
            grace=grace,
            reap_interval=reap_interval,
            poll_interval=poll_interval,
            install_signal_handlers=install_signal_handlers,
            heartbeat_interval=heartbeat_interval,
            observers=self._observers,
            schedules=schedules,
            listen=listen,
            write_batch=write_batch,
            write_backlog=write_backlog,
        )

    async def run_async(self, *, timeout: float | None = None, **options: Any) -> None:
        """Run the subscribers until stopped (``stop()``, SIGTERM or SIGINT)."""
        worker = self._worker = self.worker(**options)
        self.add_publish_listener(worker.hint)
        try:
            await worker.run_async(timeout=timeout)
        finally:
            self.remove_publish_listener(worker.hint)
            self._worker = None

    def run(self, *, timeout: float | None = None, **options: Any) -> None:
        """Blocking :meth:`run_async`."""
        self._run_blocking(until_idle=False, timeout=timeout, options=options)

    def run_until_idle(self, *, timeout: float | None = None, **options: Any) -> None:
        """Run until the subscriptions have no ready, scheduled or running messages left
        (or ``timeout`` seconds pass). For scripts and tests."""
        options.setdefault("install_signal_handlers", False)
        self._run_blocking(until_idle=True, timeout=timeout, options=options)

    def _run_blocking(
        self, *, until_idle: bool, timeout: float | None, options: dict[str, Any]
    ) -> None:
        # The worker exists before its event loop does, so that a stop() called from
        # another thread right after starting is remembered rather than lost.
        worker = self._worker = self.worker(**options)
        self.add_publish_listener(worker.hint)
        try:
            worker.run(until_idle=until_idle, timeout=timeout)
        finally:
            self.remove_publish_listener(worker.hint)
            self._worker = None

    def stop(self, *, now: bool = False) -> None:
        """Stop a running worker gracefully (or at once); safe from any thread or handler."""
        if self._worker is not None:
            self._worker.stop(now=now)
