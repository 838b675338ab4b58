"""The worker's lifecycle events, and the observer interface that metrics, tracing and
logging subscribe with.

The runtime knows nothing of Prometheus or OpenTelemetry: it calls these methods, and
observers built elsewhere (``sqlbroker.interfaces``) import their optional dependencies
lazily. Every method is called on the worker's event loop and must return quickly; an
observer that raises is logged and otherwise ignored, so it can never break the worker.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlbroker.core.message import Delivery
from sqlbroker.core.settlements import Settlement

log = logging.getLogger("sqlbroker.runtime")

NO_SCOPE: AbstractContextManager[object] = contextlib.nullcontext()
"""What :meth:`Observers.handler_scope` returns when no observer opens a scope: the pump
skips the ``with`` for it."""


class WorkerObserver:
    """Override what you need; every default does nothing."""

    def handler_scope(self, delivery: Delivery) -> AbstractContextManager[object]:
        """A context entered around the handler call, in the context the handler runs in
        (a sync handler's thread gets a copy of it): a tracing span, for example. An
        exception from the handler passes through it."""
        return NO_SCOPE

    def handler_finished(
        self, delivery: Delivery, *, seconds: float, error: BaseException | None
    ) -> None:
        """The handler returned (``error`` is ``None``) or raised, after ``seconds``."""

    def outcomes_written(self, outcomes: Sequence[Settlement]) -> None:
        """These settlements (each with its ``delivery``) were committed by the write-back
        (lost leases are not included)."""

    def outcomes_lost(self, outcomes: Sequence[Settlement]) -> None:
        """These outcomes were refused because their leases had been lost (expired and
        perhaps claimed by another consumer): nothing of them was written."""


class Observers(WorkerObserver):
    """Fans each event out to several observers, isolating their failures."""

    def __init__(self, observers: Sequence[WorkerObserver]) -> None:
        self._observers = list(observers)
        # Most observers open no scope; without one, a message skips the exit stack.
        base = WorkerObserver.handler_scope
        self._scoped = any(type(each).handler_scope is not base for each in observers)

    def handler_scope(self, delivery: Delivery) -> AbstractContextManager[object]:
        return self._scopes(delivery) if self._scoped else NO_SCOPE

    @contextlib.contextmanager
    def _scopes(self, delivery: Delivery) -> Iterator[object]:
        with contextlib.ExitStack() as stack:
            for observer in self._observers:
                try:
                    stack.enter_context(observer.handler_scope(delivery))
                except Exception:
                    log.exception("observer %r failed to open its handler scope", observer)
            yield None

    def _each(self, event: str, *args: Any, **kwargs: Any) -> None:
        for observer in self._observers:
            try:
                getattr(observer, event)(*args, **kwargs)
            except Exception:
                log.exception("observer %r failed on %s", observer, event)

    def handler_finished(
        self, delivery: Delivery, *, seconds: float, error: BaseException | None
    ) -> None:
        self._each("handler_finished", delivery, seconds=seconds, error=error)

    def outcomes_written(self, outcomes: Sequence[Settlement]) -> None:
        self._each("outcomes_written", outcomes)

    def outcomes_lost(self, outcomes: Sequence[Settlement]) -> None:
        self._each("outcomes_lost", outcomes)
