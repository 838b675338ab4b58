"""The Spark plugin's storage: its protocol (:class:`SparkStore`), its single column list
and one store per backend, each with its own SQL. The core's storage seam knows nothing of
Spark; a store reaches the queue through the broker's public operations."""

from __future__ import annotations

from typing import Any

from sqlbroker.app import Broker
from sqlbroker.core.errors import ConfigurationError
from sqlbroker.spark.storage.base import (
    SPARK_TABLES,
    ExportRun,
    ExportTotals,
    IdRange,
    SparkRowFilter,
    StreamAck,
)
from sqlbroker.spark.storage.store import SparkStore
from sqlbroker.storage.url import parse_url

__all__ = [
    "SPARK_TABLES",
    "ExportRun",
    "ExportTotals",
    "IdRange",
    "SparkRowFilter",
    "SparkStore",
    "StreamAck",
    "open_store",
]


def open_store(broker: Broker, *, url: str, options: dict[str, Any]) -> SparkStore:
    """The Spark store of ``broker``, opened from ``url`` and the backend ``options``
    (``schema``, ``busy_timeout``) it was opened with."""
    parsed = parse_url(url)
    if parsed.scheme == "sqlite":
        from sqlbroker.spark.storage.sqlite import SqliteSparkStore

        assert parsed.path is not None
        return SqliteSparkStore(
            broker.backend, path=parsed.path, busy_timeout=float(options.get("busy_timeout", 30.0))
        )
    if parsed.scheme == "postgresql":
        from sqlbroker.spark.storage.postgres import PostgresSparkStore

        return PostgresSparkStore(broker.backend, url=url, schema=options.get("schema"))
    raise ConfigurationError(f"the {broker.backend_name} backend has no Spark support")
