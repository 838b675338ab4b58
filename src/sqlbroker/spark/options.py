"""Reading the string options of ``spark.read/readStream/write.format("sqlbroker")``.

Spark hands every option over as a string; each one is checked here, on the driver, before
any task starts or any SQL runs. A bad one raises an ``InvalidOption`` naming it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from sqlbroker.app import Broker
from sqlbroker.core.errors import ConfigurationError, InvalidOption, SchemaError
from sqlbroker.core.topics import pattern_regex, validate_pattern, validate_topic
from sqlbroker.spark.storage import SPARK_TABLES, SparkRowFilter, SparkStore, open_store
from sqlbroker.storage.url import DatabaseURL, parse_url

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
    """Where the broker lives; picklable, so that tasks on executors can open it.

    Made on the driver by :meth:`of`, which turns a SQLite path absolute (an executor runs in
    a directory of its own), and :meth:`bind`, which records the database's identity. With
    an identity, :meth:`open` creates and migrates nothing and refuses any other database:
    a task that cannot reach the driver's database fails before it writes, reads or
    acknowledges anything, instead of working on a database of its own.
    """

    url: str
    backend_options: tuple[tuple[str, Any], ...] = ()
    identity: str | None = None

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Connection:
        url = required(options, "url")
        parsed = parse_url(url)
        if parsed.scheme == "sqlite":
            url = _absolute_sqlite(parsed)
        extra: list[tuple[str, Any]] = []
        for name, kind in _BACKEND_OPTIONS.items():
            raw = text(options, name)
            if raw is not None:
                try:
                    extra.append((name, kind(raw)))
                except ValueError:
                    raise InvalidOption(name, f"must be a {kind.__name__}, not {raw!r}") from None
        return cls(url=url, backend_options=tuple(extra))

    def bind(self) -> Connection:
        """On the driver: this connection with the identity of the database it reaches (a
        missing SQLite file is created and migrated there, as by ``Broker``)."""
        with self.session() as (_, store):
            return replace(self, identity=store.identity())

    def open(self) -> tuple[Broker, SparkStore]:
        """A broker and its Spark store: without an identity, as ``Broker(url)`` opens it;
        with one, only the database of that identity (else ``ConfigurationError``)."""
        if self.identity is None:
            broker = Broker(self.url, **dict(self.backend_options))
        else:
            path = parse_url(self.url).path
            if path is not None and not os.path.isfile(path):
                raise ConfigurationError(
                    f"the SQLite database {path} does not exist on {socket.gethostname()}:"
                    " every Spark task must reach the driver's database file; nothing was"
                    " written or acknowledged"
                )
            broker = Broker(self.url, migrate=False, **dict(self.backend_options))
        try:
            store = open_store(broker, url=self.url, options=dict(self.backend_options))
            if self.identity is not None and store.identity() != self.identity:
                raise SchemaError("its identity differs")
        except SchemaError as error:
            broker.close()
            if self.identity is None:
                raise
            raise ConfigurationError(
                f"{broker.url} as resolved on {socket.gethostname()} is not the database of the"
                f" driver ({error}): every Spark task must reach the same database (an absolute"
                " SQLite path on the driver's disk, a PostgreSQL URL naming host and database);"
                " nothing was written or acknowledged"
            ) from None
        except BaseException:
            broker.close()
            raise
        return broker, store

    @contextmanager
    def session(self) -> Iterator[tuple[Broker, SparkStore]]:
        """What :meth:`open` opens, the broker closed when the block ends."""
        broker, store = self.open()
        with broker:
            yield broker, store


def _absolute_sqlite(parsed: DatabaseURL) -> str:
    """The URL of a SQLite file by its absolute path, as the driver resolves it."""
    assert parsed.path is not None
    if parsed.path == ":memory:":
        raise InvalidOption(
            "url", "an in-memory SQLite database lives in one process: Spark's tasks run in others"
        )
    path = os.path.abspath(os.path.expanduser(parsed.path))
    return f"sqlite:///{quote(path)}"


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
