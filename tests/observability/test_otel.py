"""OpenTelemetry: trace context travels in headers from publish to a consumer span around
the handler. A real SDK with its in-memory exporter records the spans."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, get_current_span

import sqlbroker
from runtime.support import run_until_idle
from sqlbroker.interfaces import otel


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def test_a_trace_runs_from_publish_through_the_handler(
    broker: sqlbroker.Broker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    otel.instrument(broker, tracer_provider=provider)
    seen: dict[str, int] = {}

    @broker.subscriber(queue="sync-jobs", retry=sqlbroker.RetryPolicy(max_attempts=1))
    def handle(msg: sqlbroker.Message) -> None:
        # The consumer span is current in the handler's thread.
        seen[str(msg.payload)] = get_current_span().get_span_context().trace_id
        if msg.payload == "bad":
            raise ValueError("no good")

    @broker.subscriber(topics=["events.*"], name="async-events")
    async def on_event(msg: sqlbroker.Message) -> None:
        seen["event"] = get_current_span().get_span_context().trace_id

    broker.subscribe("async-events", ["events.*"])
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        broker.send("sync-jobs", "good")
        broker.publish("events.created", {"n": 1}, headers={"x-own": "kept"})
    broker.send("sync-jobs", "bad")  # outside any span: a trace of its own
    run_until_idle(broker)

    spans = exporter.get_finished_spans()
    trace_id = request.get_span_context().trace_id
    consumers = by_name(spans, "sync-jobs process")
    assert len(consumers) == 2
    linked = [s for s in consumers if s.context.trace_id == trace_id]
    assert len(linked) == 1
    assert linked[0].parent is not None
    assert linked[0].parent.span_id == request.get_span_context().span_id
    assert linked[0].kind is SpanKind.CONSUMER
    assert linked[0].attributes["messaging.consumer.group.name"] == "sync-jobs"
    assert linked[0].attributes["sqlbroker.attempt"] == 1
    assert linked[0].status.status_code is StatusCode.UNSET
    failed = [s for s in consumers if s.context.trace_id != trace_id]
    assert failed[0].status.status_code is StatusCode.ERROR
    assert [e.name for e in failed[0].events] == ["exception"]
    assert failed[0].parent is None
    assert seen["good"] == trace_id
    assert seen["bad"] == failed[0].context.trace_id
    (event,) = by_name(spans, "async-events process")
    assert event.context.trace_id == trace_id
    assert seen["event"] == trace_id
    assert event.attributes["messaging.destination.name"] == "events.created"


def test_published_headers_carry_traceparent_and_keep_their_own(
    broker: sqlbroker.Broker, provider: TracerProvider
) -> None:
    otel.instrument(broker, tracer_provider=provider)
    with provider.get_tracer("test").start_as_current_span("request") as request:
        broker.send("q", 1, headers={"x-own": "kept"})
        broker.send("q", 2, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    broker.send("q", 3)
    first, second, third = broker.claim("q", limit=3)
    expected = f"{request.get_span_context().trace_id:032x}"
    assert first.headers["x-own"] == "kept"
    assert first.headers["traceparent"].split("-")[1] == expected
    assert second.headers["traceparent"].split("-")[1] == "1" * 32
    assert "traceparent" not in third.headers


def test_async_publish_keeps_the_callers_context(
    backend_url: str, provider: TracerProvider
) -> None:
    async def main() -> str:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            otel.instrument(broker, tracer_provider=provider)
            with provider.get_tracer("test").start_as_current_span("request") as request:
                await broker.send("q", 1)
            (delivery,) = await broker.claim("q")
            assert delivery.headers["traceparent"].split("-")[1] == (
                f"{request.get_span_context().trace_id:032x}"
            )
            return delivery.headers["traceparent"]

    assert asyncio.run(main()).startswith("00-")
