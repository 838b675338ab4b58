"""Choose and open the backend for a URL."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from sqlbroker.core.clock import Clock, DatabaseClock
from sqlbroker.core.errors import ConfigurationError, InvalidOption
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.url import DatabaseURL, parse_url

if TYPE_CHECKING:
    from sqlbroker.storage.postgres.backend import PostgresBackend
    from sqlbroker.storage.sqlite.backend import SqliteBackend


def open_backend(url: str, *, clock: Clock | None = None, **options: Any) -> Backend:
    """Open the backend for ``url`` with backend-specific ``options``.

    Both: ``durable_claims`` (``False``, the default: a claim's commit does not wait for the
    flush of the log; ``True``: it does, like every other write) and ``archive_completed``
    (``True``, the default: a completed copy is kept in the archive until trimmed;
    ``False``: it is only deleted, which makes acks cheaper and the archive hold expired,
    cancelled and unrouted copies only). SQLite: ``synchronous``
    (``"full"``/``"normal"``), ``busy_timeout`` (s), ``pool_size``. PostgreSQL: ``schema``,
    ``pool_size``, ``synchronous_commit`` (``"on"``/``"off"``), ``connect_timeout`` (s),
    ``network_timeout`` (s, 30: a dead peer is noticed within it; see docs/reliability.md),
    ``lock_timeout`` and ``statement_timeout`` (s, a third and two thirds of
    ``network_timeout``; 0: none) for sqlbroker's own statements, ``pooler`` (``None``,
    ``"session"`` or ``"transaction"``: the pooling mode of a PgBouncer-like pooler in
    front of the server) and ``listen_url`` (a direct URL for LISTEN sessions).
    """
    parsed = parse_url(url)
    if clock is not None and not callable(getattr(clock, "now", None)):
        raise InvalidOption("clock", f"must be a Clock (with a now() method), not {clock!r}")
    clock = clock or DatabaseClock()
    backend = backend_class(parsed)
    _check_options(backend, options)
    return backend(parsed, clock=clock, **options)


def backend_class(url: DatabaseURL) -> type[SqliteBackend] | type[PostgresBackend]:
    """The backend class for ``url``'s scheme, imported on first use; a
    ``ConfigurationError`` naming the postgres extra when PostgreSQL's is unavailable."""
    if url.scheme == "sqlite":
        from sqlbroker.storage.sqlite.backend import SqliteBackend

        return SqliteBackend
    try:
        from sqlbroker.storage.postgres.backend import PostgresBackend
    except ImportError as error:
        raise ConfigurationError(
            "PostgreSQL support needs the postgres extra:"
            f" pip install 'sqlbroker[postgres]' ({error})"
        ) from None
    return PostgresBackend


def _check_options(backend: type[Backend], options: dict[str, Any]) -> None:
    """An option the backend does not take (``schema=`` on SQLite) is bad input, not a
    ``TypeError``."""
    accepted = set(inspect.signature(backend).parameters) - {"url", "clock"}
    for name in options:
        if name not in accepted:
            raise InvalidOption(
                name,
                f"is not an option of the {backend.schema_files.label} backend"
                f" ({', '.join(sorted(accepted))})",
            )
