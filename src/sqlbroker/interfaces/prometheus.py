"""Prometheus metrics (the ``metrics`` extra: ``prometheus-client``, imported lazily).

Two sources, one exposition:

- :class:`DatabaseCollector` reads the database at scrape time: queue gauges per
  subscription, lifetime outcome counters that every worker's heartbeat adds to, recent
  handler-time quantiles, expired and unrouted copies in the archive, and live workers. It
  is the same whichever process serves it, so scrape it from one place (``sqlbroker
  metrics``) or take ``max`` across workers.
- :class:`HandlerMetrics` observes one worker process: a real histogram of its handler
  times and a gauge of its running handlers (``sqlbroker worker --metrics-port``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlbroker.app import Broker
from sqlbroker.core import observability as facts
from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.message import Delivery
from sqlbroker.core.observability import HANDLER_BUCKETS
from sqlbroker.runtime.events import WorkerObserver

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("sqlbroker.metrics")

DEFAULT_PORT = 9464
DEFAULT_HEARTBEAT_AGE = 30.0


# The gauges of each subscription: name, help and the SubscriptionStats field read (a flag
# as 1 or 0, no oldest ready message as 0).
_GAUGES = (
    ("sqlbroker_messages_ready", "Messages ready to be claimed.", "ready"),
    ("sqlbroker_messages_scheduled", "Messages delayed or backing off.", "scheduled"),
    ("sqlbroker_messages_running", "Messages leased to a handler.", "running"),
    ("sqlbroker_messages_blocked", "Messages waiting behind their key.", "blocked"),
    ("sqlbroker_dead_letters", "Dead letters held (not replayed or purged).", "dead"),
    ("sqlbroker_expired_messages", "Expired messages in the archive.", "expired"),
    (
        "sqlbroker_oldest_ready_age_seconds",
        "Age of the oldest ready message (consumer lag); 0 when none is ready.",
        "oldest_ready_age",
    ),
    (
        "sqlbroker_subscription_paused",
        "1 while claims from the subscription are paused (Broker.pause), else 0.",
        "paused",
    ),
    (
        "sqlbroker_subscription_throttled",
        "1 while the subscription's flow limits hold claims back (its rate limit, or"
        " max_running copies running; Broker.set_flow), else 0.",
        "throttled",
    ),
    (
        "sqlbroker_subscription_throttled_seconds",
        "Seconds until the subscription's rate limit lets the next claim through.",
        "throttled_for",
    ),
)


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise SqlbrokerError(
            "Prometheus metrics need prometheus-client: pip install 'sqlbroker[metrics]'"
        ) from None
    return prometheus_client


class DatabaseCollector:
    """A Prometheus collector computing every series from the database at scrape time."""

    def __init__(
        self,
        broker: Broker,
        *,
        window: float = facts.RATE_WINDOW,
        heartbeat_age: float = DEFAULT_HEARTBEAT_AGE,
    ) -> None:
        self._broker = broker
        self._window = window
        self._heartbeat_age = heartbeat_age

    def describe(self) -> list[Any]:
        # No description up front: the registry must not scrape the database on register.
        return []

    def collect(self) -> Iterator[Any]:
        _client()
        import prometheus_client.core as core

        up = core.GaugeMetricFamily("sqlbroker_up", "1 when the database could be read.")
        try:
            families = list(self._families(core))
        except SqlbrokerError as error:
            log.warning("metrics scrape failed: %s", error)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self, core: Any) -> Iterator[Any]:
        backend = self._broker.backend
        stats = self._broker.stats(window=self._window)
        for name, text, field in _GAUGES:
            family = core.GaugeMetricFamily(name, text, labels=["subscription"])
            for row in stats:
                family.add_metric([row.subscription], float(getattr(row, field) or 0))
            yield family
        quantiles = core.GaugeMetricFamily(
            "sqlbroker_handler_recent_duration_seconds",
            f"Handler time quantiles over the last {self._window:g} s, all workers.",
            labels=["subscription", "quantile"],
        )
        for row in stats:
            for q, seconds in (("0.5", row.handler_p50), ("0.95", row.handler_p95)):
                if seconds is not None:
                    quantiles.add_metric([row.subscription, q], seconds)
        yield quantiles
        totals = core.CounterMetricFamily(
            "sqlbroker_messages",
            "Outcomes written back by workers (and replaced publishes: outcome replaced),"
            " since the database was created.",
            labels=["subscription", "outcome"],
        )
        for (subscription, outcome), count in sorted(backend.metric_totals().items()):
            totals.add_metric([subscription, outcome], count)
        yield totals
        unrouted = self._broker.unrouted(window=self._window)
        yield core.GaugeMetricFamily(
            "sqlbroker_unrouted_messages",
            "Publishes that matched no subscription, in the archive.",
            value=unrouted.total,
        )
        workers = self._broker.workers()
        alive = facts.alive(workers, max_age=self._heartbeat_age)
        yield core.GaugeMetricFamily(
            "sqlbroker_workers_alive",
            f"Workers with a heartbeat in the last {self._heartbeat_age:g} s.",
            value=len(alive),
        )
        age = core.GaugeMetricFamily(
            "sqlbroker_worker_heartbeat_age_seconds",
            "Seconds since each running worker's last heartbeat.",
            labels=["worker"],
        )
        for worker in workers:
            if worker.stopped_at is None:
                age.add_metric([worker.name], worker.seen_age)
        yield age


class HandlerMetrics(WorkerObserver):
    """Process-local handler metrics of one worker, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        client = _client()
        self._duration = client.Histogram(
            "sqlbroker_handler_duration_seconds",
            "Handler time in this worker process.",
            ["subscription"],
            buckets=HANDLER_BUCKETS,
            registry=registry,
        )
        self._running = client.Gauge(
            "sqlbroker_handlers_running",
            "Handlers running in this worker process.",
            ["subscription"],
            registry=registry,
        )
        self._failures = client.Counter(
            "sqlbroker_handler_errors",
            "Handler calls that raised, in this worker process.",
            ["subscription"],
            registry=registry,
        )

    def handler_scope(self, delivery: Delivery) -> Any:
        return self._running.labels(delivery.subscription).track_inprogress()

    def handler_finished(
        self, delivery: Delivery, *, seconds: float, error: BaseException | None
    ) -> None:
        self._duration.labels(delivery.subscription).observe(seconds)
        if error is not None:
            self._failures.labels(delivery.subscription).inc()


def registry_for(broker: Broker, **options: Any) -> CollectorRegistry:
    """A fresh registry holding a :class:`DatabaseCollector` for ``broker``."""
    registry: CollectorRegistry = _client().CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(broker, **options))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format."""
    data: bytes = _client().generate_latest(registry)
    return data


def serve(registry: CollectorRegistry, *, port: int, host: str) -> None:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
    _client().start_http_server(port, addr=host, registry=registry)
