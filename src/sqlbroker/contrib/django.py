"""Django integration: a broker configured by settings, whose publishes join Django's
transaction on the configured database.

.. code-block:: python

    # settings.py — all optional
    SQLBROKER = {
        "DATABASE": "default",     # the alias whose transaction publishes join
        "URL": None,               # default: the same database as that alias
        "OPTIONS": {"max_attempts": 10},
    }

    # anywhere
    from django.db import transaction
    from sqlbroker.contrib.django import publish

    with transaction.atomic():
        order = Order.objects.create(...)
        publish("orders.created", {"id": order.id})   # commits or rolls back with order

Outside ``atomic()`` Django runs in autocommit and the publish commits at once, as the
ORM's own writes do. PostgreSQL needs Django's psycopg 3 backend (Django ≥ 4.2 uses it
when ``psycopg`` is installed); SQLite works with the stock backend.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connections

from sqlbroker.app import Broker
from sqlbroker.core.errors import ConfigurationError

_lock = threading.Lock()
_brokers: dict[tuple[str, tuple[tuple[str, Any], ...]], Broker] = {}


def _config() -> dict[str, Any]:
    config = getattr(settings, "SQLBROKER", None) or {}
    if not isinstance(config, Mapping):
        raise ConfigurationError("settings.SQLBROKER must be a dict")
    unknown = set(config) - {"DATABASE", "URL", "OPTIONS"}
    if unknown:
        raise ConfigurationError(f"settings.SQLBROKER has unknown keys: {sorted(unknown)}")
    return dict(config)


def database_alias() -> str:
    alias = _config().get("DATABASE") or "default"
    if alias not in settings.DATABASES:
        raise ConfigurationError(f"settings.SQLBROKER['DATABASE'] names no database: {alias!r}")
    return str(alias)


def url_of(alias: str) -> str:
    """The sqlbroker URL of a Django database alias."""
    database = settings.DATABASES[alias]
    engine = database.get("ENGINE", "")
    if engine == "django.db.backends.sqlite3":
        return f"sqlite:///{database['NAME']}"
    if engine == "django.db.backends.postgresql":
        user = quote(str(database.get("USER") or ""), safe="")
        password = quote(str(database.get("PASSWORD") or ""), safe="")
        credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = database.get("HOST") or "localhost"
        port = f":{database['PORT']}" if database.get("PORT") else ""
        return f"postgresql://{credentials}{host}{port}/{quote(str(database['NAME']), safe='')}"
    raise ConfigurationError(
        f"database {alias!r} uses {engine!r}; sqlbroker supports PostgreSQL and SQLite"
    )


def broker_settings() -> tuple[str, dict[str, Any]]:
    """The URL and the ``Broker`` options that settings.SQLBROKER asks for."""
    config = _config()
    url = config.get("URL") or url_of(database_alias())
    return str(url), dict(config.get("OPTIONS") or {})


def new_broker() -> Broker:
    """A broker of its own for the current settings (not the shared one of
    :func:`get_broker`): for a worker that registers its own subscribers."""
    url, options = broker_settings()
    return Broker(url, **options)


def get_broker() -> Broker:
    """The broker for the current settings, created once (thread-safe)."""
    url, options = broker_settings()
    cache_key = (url, tuple(sorted(options.items())))
    with _lock:
        broker = _brokers.get(cache_key)
        if broker is None:
            broker = _brokers[cache_key] = Broker(url, **options)
    return broker


def _connection(using: str | None) -> Any:
    return connections[using or database_alias()]


def publish(topic: str, payload: Any, *, using: str | None = None, **options: Any) -> str:
    """``Broker.publish`` inside Django's transaction on ``using`` (default: the configured
    alias)."""
    return get_broker().publish(topic, payload, conn=_connection(using), **options)


def publish_many(messages: Iterable[Mapping[str, Any]], *, using: str | None = None) -> list[str]:
    return get_broker().publish_many(messages, conn=_connection(using))


def send(queue: str, payload: Any, *, using: str | None = None, **options: Any) -> str:
    return get_broker().send(queue, payload, conn=_connection(using), **options)
