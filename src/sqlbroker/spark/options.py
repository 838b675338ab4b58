"""Reading the string options of ``spark.read/readStream/write.format("sqlbroker")``.

Spark hands every option over as a string; each one is checked here, on the driver, before
any task starts or any SQL runs. A bad one raises an ``InvalidOption`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlbroker.core.errors import ConfigurationError, InvalidOption
from sqlbroker.core.topics import pattern_regex, validate_pattern, validate_topic
from sqlbroker.producer.broker import Broker
from sqlbroker.storage.spark_base import SPARK_TABLES, SparkBackend, SparkRowFilter
from sqlbroker.storage.url import parse_url

_BACKEND_OPTIONS = {"schema": str, "pool_size": int, "busy_timeout": float}


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def text(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = _lower(options).get(name)
    return default if value is None or value == "" else value


def required(options: Mapping[str, str], name: str) -> str:
    value = text(options, name)
    if value is None:
        raise InvalidOption(name, "is required")
    return value


def integer(
    options: Mapping[str, str], name: str, default: int, *, minimum: int, maximum: int
) -> int:
    raw = text(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidOption(name, f"must be an integer, not {raw!r}") from None
    if not minimum <= value <= maximum:
        raise InvalidOption(name, f"must be from {minimum} to {maximum}, not {value}")
    return value


def number(
    options: Mapping[str, str], name: str, default: float, *, minimum: float, maximum: float
) -> float:
    raw = text(options, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidOption(name, f"must be a number of seconds, not {raw!r}") from None
    if not minimum <= value <= maximum:
        raise InvalidOption(name, f"must be from {minimum:g} to {maximum:g}, not {value:g}")
    return value


def point_in_time(options: Mapping[str, str], name: str) -> datetime | None:
    raw = text(options, name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidOption(
            name, f"must be an ISO 8601 time such as 2024-05-01T12:00:00Z, not {raw!r}"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the broker lives; picklable, so that tasks on executors can open it."""

    url: str
    backend_options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Connection:
        url = required(options, "url")
        parse_url(url)
        extra: list[tuple[str, Any]] = []
        for name, kind in _BACKEND_OPTIONS.items():
            raw = text(options, name)
            if raw is not None:
                try:
                    extra.append((name, kind(raw)))
                except ValueError:
                    raise InvalidOption(name, f"must be a {kind.__name__}, not {raw!r}") from None
        return cls(url=url, backend_options=tuple(extra))

    def open(self) -> tuple[Broker, SparkBackend]:
        """A broker (migrated on SQLite, checked on PostgreSQL) and its Spark operations."""
        broker = Broker(self.url, **dict(self.backend_options))
        backend: Any = broker.backend
        if not hasattr(backend, "spark_stage_insert"):
            broker.close()
            raise ConfigurationError(f"the {broker.backend_name} backend has no Spark support")
        spark_backend: SparkBackend = backend
        return broker, spark_backend


def row_filter(options: Mapping[str, str], *, table: str | None = None) -> SparkRowFilter:
    """The ``table``, ``subscription``, ``topic``, ``since`` and ``until`` options."""
    chosen = table or text(options, "table", "messages")
    if chosen not in SPARK_TABLES:
        raise InvalidOption("table", f"must be one of {', '.join(SPARK_TABLES)}, not {chosen!r}")
    subscription = text(options, "subscription")
    if subscription is not None:
        validate_topic(subscription, "subscription")
    topic = text(options, "topic")
    since = point_in_time(options, "since")
    until = point_in_time(options, "until")
    if since is not None and until is not None and until <= since:
        raise InvalidOption("until", "must be later than since")
    return SparkRowFilter(
        table=chosen,
        subscription=subscription,
        topic_regex=None if topic is None else pattern_regex(validate_pattern(topic, "topic")),
        since=since,
        until=until,
    )
