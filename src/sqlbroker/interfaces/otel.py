"""OpenTelemetry tracing (the ``otel`` extra: ``opentelemetry-api``, imported lazily).

``instrument(broker)`` does two things:

- at publish, the current trace context is injected into each message's headers
  (``traceparent`` and ``tracestate``, through the globally configured propagator), unless
  the message sets them itself;
- in workers, a ``CONSUMER`` span named ``"<subscription> process"`` is opened around each
  handler call, as a child of the context extracted from the message's headers, so a trace
  runs from the publishing request through the handler. The span is current while the
  handler runs (in its thread too, for a plain function); an exception the handler raises
  is recorded on it and sets its status to error.

The application configures the SDK and exporter as usual; without an SDK the API's no-op
tracer makes all of this free.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from sqlbroker.app import AsyncBroker, Broker
from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.message import Delivery
from sqlbroker.runtime.events import WorkerObserver

INSTRUMENTATION_NAME = "sqlbroker"


def _api() -> tuple[Any, Any]:
    try:
        from opentelemetry import propagate, trace
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise SqlbrokerError(
            "tracing needs opentelemetry-api: pip install 'sqlbroker[otel]'"
        ) from None
    return propagate, trace


def inject_headers() -> dict[str, str]:
    """The current trace context as message headers (empty outside a span)."""
    propagate, _ = _api()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


class TracingObserver(WorkerObserver):
    """Opens a consumer span around every handler call."""

    def __init__(self, tracer_provider: Any = None) -> None:
        _, trace = _api()
        self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, tracer_provider=tracer_provider)

    def handler_scope(self, delivery: Delivery) -> AbstractContextManager[object]:
        propagate, trace = _api()
        parent = propagate.extract(_carrier(delivery.headers))
        span: AbstractContextManager[object] = self._tracer.start_as_current_span(
            f"{delivery.subscription} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "sqlbroker",
                "messaging.operation.type": "process",
                "messaging.destination.name": delivery.topic,
                "messaging.consumer.group.name": delivery.subscription,
                "messaging.message.id": delivery.message_id,
                "sqlbroker.delivery.id": delivery.id,
                "sqlbroker.attempt": delivery.attempt,
            },
        )
        return span


def _carrier(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def instrument(broker: Broker | AsyncBroker, *, tracer_provider: Any = None) -> None:
    """Carry trace context in the headers of what ``broker`` publishes and, when it runs
    subscribers, open a consumer span around each handler."""
    _api()
    broker.add_header_hook(inject_headers)
    broker.add_observer(TracingObserver(tracer_provider))
