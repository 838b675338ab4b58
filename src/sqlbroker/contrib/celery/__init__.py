"""Celery on sqlbroker: a Kombu transport, so that a Celery app's broker is your database.

.. code-block:: python

    import sqlbroker.contrib.celery  # registers the sqlbroker+… broker URLs with Kombu
    from celery import Celery

    app = Celery(
        "shop",
        broker="sqlbroker+postgresql://app@db/app",
        backend="sqlbroker+postgresql://app@db/app",  # results too (optional)
    )

Importing this package registers the transport alias ``sqlbroker`` with Kombu and the result
backend alias ``sqlbroker`` with Celery, so ``sqlbroker+postgresql://…`` and
``sqlbroker+sqlite:///path.db`` work as ``broker_url`` and as ``result_backend``.
Needs the ``celery`` extra (``pip install 'sqlbroker[celery]'``). See docs/celery.md for what
is kept of sqlbroker's guarantees and what is not.
"""

from __future__ import annotations

from sqlbroker.core.errors import ConfigurationError

try:
    from celery.app.backends import BACKEND_ALIASES
    from kombu.transport import TRANSPORT_ALIASES
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "sqlbroker.contrib.celery needs Celery and Kombu:"
        f" pip install 'sqlbroker[celery]' ({error})"
    ) from None

from sqlbroker.contrib.celery.transport import Transport, publishing_in, queue_name

SCHEME = "sqlbroker"
"""The Kombu transport alias: broker URLs read ``sqlbroker+<database URL>``."""

TRANSPORT_ALIASES.setdefault(SCHEME, "sqlbroker.contrib.celery.transport:Transport")
BACKEND_ALIASES.setdefault(SCHEME, "sqlbroker.contrib.celery.results:ResultBackend")

__all__ = ["SCHEME", "Transport", "publishing_in", "queue_name"]
