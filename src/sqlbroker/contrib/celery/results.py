"""A Celery result backend on sqlbroker: ``result_backend = "sqlbroker+<database URL>"``.

Celery keys a result by its task id (``celery-task-meta-<id>``), keeps group results and
chord counters beside them, and reads them back by key: this backend stores them in
sqlbroker's results by key (``sqlbroker_task_result``, migration 16) in the same database
as the queue, so a task's result is committed there like its message was.

- ``AsyncResult.get()`` waits on sqlbroker's result watch instead of polling Celery's
  ``interval``: storing a value NOTIFYs its key on PostgreSQL, SQLite's change watcher sees
  the commit; a fallback look every :data:`~sqlbroker.features.results.FALLBACK_POLL`
  seconds covers a lost hint.
- ``result_expires`` is each result's retention (``None`` or 0: the broker's
  ``result_ttl``, one day by default: nothing is kept without bound). An expired result
  reads as ``PENDING`` at once; the rows are deleted by the backend itself (every
  :attr:`ResultBackend.trim_every` results it stores, it deletes expired ones), by the
  reaper (``broker.reap()``, ``sqlbroker worker``) and by Celery beat's daily
  ``celery.backend_cleanup`` task.
- Chords count their finished parts with an atomic counter (``implements_incr``).
- ``app.close()`` (``with Celery(...) as app:``) closes the backend's broker, its result
  watch (SQLite's watcher thread, PostgreSQL's LISTEN connection) with it; Celery itself
  closes no result backend, so :class:`ResultBackend` ties its :meth:`~ResultBackend.close`
  to its app's.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from celery import states
from celery.backends.base import KeyValueStoreBackend
from celery.exceptions import TimeoutError as CeleryTimeout

from sqlbroker.app import Broker
from sqlbroker.contrib.celery.transport import _acquire, _release, _Shared, broker_options
from sqlbroker.core import validate
from sqlbroker.core.errors import ConnectionLost, DatabaseBusy, InvalidOption, StorageFull
from sqlbroker.features.results import FALLBACK_POLL, MIN_LOOK_GAP
from sqlbroker.storage.backend import Backend

TRIM_BATCH = 1000
"""Expired rows deleted per statement by :meth:`ResultBackend.cleanup`."""
_OPTIONS = frozenset({"migrate", "broker_options", "global_keyprefix"})


MAX_KEY = 512
"""Characters of a result key (Celery's are about 60): at most 2 KB of UTF-8, so that both
databases store any key the other stores (PostgreSQL's index refuses a row over ~2.7 KB)."""


def _text(key: bytes | str) -> str:
    """Celery's keys are bytes; the store's are text, checked before any SQL."""
    name = key.decode("utf-8", errors="surrogateescape") if isinstance(key, bytes) else key
    return validate.text(name, "key", maximum=MAX_KEY)


class ResultBackend(KeyValueStoreBackend):  # type: ignore[misc]
    """Celery's results in sqlbroker's database.

    ``result_backend_transport_options`` (all optional): ``migrate`` (create or upgrade the
    schema on connect; default: on SQLite only), ``broker_options`` (more keyword arguments
    of :class:`~sqlbroker.Broker`: ``schema``, ``pool_size``, ``result_ttl``, …) and
    Celery's own ``global_keyprefix``.
    """

    supports_autoexpire = False  # Celery beat then schedules backend_cleanup (cleanup())
    supports_result_compression = True
    implements_incr = True
    persistent = True
    thread_safe = True
    """One backend per app, shared by its threads (the broker under it is thread-safe):
    Celery would otherwise make one per thread, each holding the database open."""
    trim_every = 100
    """After this many stored results, delete up to :data:`TRIM_BATCH` expired ones: the
    table stays bounded with no reaper and no Celery beat running."""

    def __init__(self, app: Any = None, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app=app, url=url, **kwargs)
        options = dict(self.app.conf.get("result_backend_transport_options") or {})
        self._broker_options = broker_options(
            "result_backend_transport_options", options, _OPTIONS, ("migrate",)
        )
        if not url:
            raise InvalidOption(
                "result_backend", "needs a database URL: sqlbroker+postgresql://… or sqlite"
            )
        self._database_url = url
        self._lock = threading.Lock()
        self._shared: _Shared | None = None
        self._pid = os.getpid()
        self._stored = 0
        if self.expires is not None:
            validate.seconds(self.expires, "result_expires")
        self._opened()  # bad URLs and options fail here, before any task runs
        _close_with_app(self.app, self)

    # --- the database ------------------------------------------------------------------------

    def _opened(self) -> Broker:
        """The process's broker on the database (a forked worker child opens its own)."""
        shared = self._shared
        if shared is None or self._pid != os.getpid():
            with self._lock:
                shared = self._shared
                if shared is None or self._pid != os.getpid():
                    # A parent's connections are not the child's to use, nor to close.
                    shared = self._shared = _acquire(self._database_url, self._broker_options)
                    self._pid = os.getpid()
        return shared.broker

    def close(self) -> None:
        """Close this backend's hold on the database: the broker (its connections and its
        result watch) closes once the process's Kombu connections to it are closed too.
        ``app.close()`` calls it; a later use opens the database again."""
        with self._lock:
            shared, self._shared = self._shared, None
        if shared is not None and self._pid == os.getpid():
            _release(shared)

    @property
    def store(self) -> Backend:
        """sqlbroker's storage backend that keeps the results."""
        return self._opened().backend

    def _ttl(self, seconds: float | None) -> float:
        """Seconds to keep a row: Celery's expiry, else the broker's ``result_ttl``."""
        return float(seconds) if seconds else self._opened().result_ttl

    # --- Celery's key-value interface --------------------------------------------------------

    def get(self, key: bytes | str) -> bytes | None:
        """The stored value of ``key`` (``None``: absent or expired)."""
        name = _text(key)
        return self.store.task_result_get_many(keys=[name]).get(name)

    def mget(self, keys: list[bytes | str]) -> list[bytes | None]:
        """The values of ``keys``, in their order, in one round trip."""
        names = [_text(key) for key in keys]
        found = self.store.task_result_get_many(keys=names)
        return [found.get(name) for name in names]

    def set(self, key: bytes | str, value: bytes | str) -> None:
        """Store ``value`` for ``result_expires`` and wake the key's waiters."""
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        self.store.task_result_set(key=_text(key), value=data, ttl=self._ttl(self.expires))
        self._stored += 1
        if self._stored % self.trim_every == 0:
            self.store.task_result_trim(limit=TRIM_BATCH)

    def delete(self, key: bytes | str) -> None:
        """Forget ``key``."""
        self.store.task_result_delete(keys=[_text(key)])

    def incr(self, key: bytes | str) -> int:
        """Count one more finished chord part; return the count."""
        return self.store.task_result_incr(key=_text(key), ttl=self._ttl(self.expires))

    def expire(self, key: bytes | str, value: float | None) -> None:
        """Keep ``key`` ``value`` seconds from now (``None``/0: the broker's ``result_ttl``)."""
        self.store.task_result_expire(key=_text(key), ttl=self._ttl(value))

    def cleanup(self) -> None:
        """Delete every expired result (Celery's ``backend_cleanup`` task calls this)."""
        while self.store.task_result_trim(limit=TRIM_BATCH) >= TRIM_BATCH:
            pass

    def exception_safe_to_retry(self, exc: BaseException) -> bool:
        """With ``result_backend_always_retry``, a lost, busy or full database is tried again."""
        return isinstance(exc, ConnectionLost | DatabaseBusy | StorageFull)

    # --- waiting -----------------------------------------------------------------------------

    def wait_for(
        self,
        task_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_interval: Any = None,
    ) -> dict[str, Any]:
        """The task's meta once it is ready, woken by its result's NOTIFY (PostgreSQL) or a
        commit (SQLite) rather than polling every ``interval``; raises Celery's
        ``TimeoutError`` after ``timeout`` seconds."""
        self._ensure_not_eager()
        meta: dict[str, Any] = self.get_task_meta(task_id)
        if meta["status"] in states.READY_STATES:
            return meta
        deadline = None if timeout is None else time.monotonic() + timeout
        key = _text(self.get_key_for_task(task_id))
        with self.store.result_watch(message_id=key) as watch:
            while True:
                looked = time.monotonic()
                meta = self.get_task_meta(task_id)
                if meta["status"] in states.READY_STATES:
                    return meta
                if on_interval:
                    on_interval()
                remaining = FALLBACK_POLL if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise CeleryTimeout("The operation timed out.")
                watch.wait(min(remaining, FALLBACK_POLL))
                # SQLite hints every commit to every waiter: look at most every gap.
                time.sleep(max(0.0, looked + MIN_LOOK_GAP - time.monotonic()))

    def as_uri(self, include_password: bool = False) -> str:
        uri: str = super().as_uri(include_password)
        return f"sqlbroker+{uri}"


def _close_with_app(app: Any, backend: ResultBackend) -> None:
    """Make ``app.close()`` close ``backend`` too: Celery's close drops the app's pool and
    calls no close of its result backend, whose broker would keep its connections and
    result watch until the process exits."""
    close_app = app.close

    def close() -> None:
        try:
            backend.close()
        finally:
            close_app()

    app.close = close
