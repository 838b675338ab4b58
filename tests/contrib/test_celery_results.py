"""Celery's result backend on sqlbroker, with real ``celery worker`` processes on both
backends: a task's return value, a failure's exception type and traceback, a chord's
counter, ``result_expires`` as the results' retention; and bad configuration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, chord, signature
from celery.exceptions import TimeoutError as CeleryTimeout

import sqlbroker
from helpers import table_counts
from runtime.support import wait_until
from sqlbroker.contrib.celery import SCHEME
from sqlbroker.contrib.celery.results import ResultBackend

SRC = Path(__file__).resolve().parents[2] / "src"

APP = """\
import os

import sqlbroker.contrib.celery  # the sqlbroker+… broker and result backend URLs
from celery import Celery

app = Celery("shop", broker=os.environ["BROKER_URL"], backend=os.environ["BROKER_URL"])
app.conf.task_acks_late = True
app.conf.result_expires = float(os.environ["RESULT_EXPIRES"])


@app.task(name="shop.add")
def add(x, y):
    return x + y


@app.task(name="shop.total")
def total(numbers):
    return sum(numbers)


@app.task(name="shop.fail")
def fail(sku):
    raise LookupError(f"no stock for {sku}")
"""


class Worker:
    """One ``celery worker`` (prefork, 2 children) in its own process group."""

    def __init__(self, directory: Path, url: str, expires: float) -> None:
        (directory / "shop_results.py").write_text(APP, encoding="utf-8")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(SRC), str(directory)]),
            "BROKER_URL": f"{SCHEME}+{url}",
            "RESULT_EXPIRES": str(expires),
        }
        with (directory / "worker.log").open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "shop_results", "worker"),
                    *("-c", "2", "-l", "INFO"),
                    *("--without-mingle", "--without-gossip", "--without-heartbeat"),
                ],
                cwd=directory,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _client(url: str, expires: float) -> Celery:
    """The application's side: the same task names, sent and awaited from this process."""
    app = Celery("shop", broker=f"{SCHEME}+{url}", backend=f"{SCHEME}+{url}", set_as_current=False)
    app.conf.result_expires = expires
    return app


@pytest.fixture
def client(broker: sqlbroker.Broker, backend_url: str) -> Iterator[Celery]:
    app = _client(backend_url, 3600)
    yield app
    app.close()


@pytest.mark.slow
def test_results_and_failures_come_back_from_a_real_worker(
    client: Celery, backend_url: str, tmp_path: Path
) -> None:
    assert isinstance(client.backend, ResultBackend)
    added = client.send_task("shop.add", (2, 3))
    failed = client.send_task("shop.fail", ("sku-7",))
    assert (added.status, added.ready()) == ("PENDING", False), "no worker yet"
    with pytest.raises(CeleryTimeout):
        added.get(timeout=0.2)

    started = Worker(tmp_path, backend_url, 3600)
    try:
        assert added.get(timeout=60) == 5
        assert (added.status, added.ready(), added.successful()) == ("SUCCESS", True, True)

        with pytest.raises(LookupError, match="no stock for sku-7"):
            failed.get(timeout=60)
        assert failed.status == "FAILURE"
        assert isinstance(failed.result, LookupError)
        assert failed.traceback is not None
        assert 'raise LookupError(f"no stock for {sku}")' in failed.traceback

        # A chord counts its finished parts with the store's counter.
        parts = [signature("shop.add", (n, n), app=client) for n in range(4)]
        joined = chord(parts, app=client)(signature("shop.total", app=client))
        assert joined.get(timeout=60) == 12
    finally:
        started.close()


@pytest.mark.slow
def test_result_expires_is_the_retention(
    broker: sqlbroker.Broker, backend_url: str, tmp_path: Path
) -> None:
    app = _client(backend_url, 1)
    started = Worker(tmp_path, backend_url, 1)
    try:
        added = app.send_task("shop.add", (20, 22))
        assert added.get(timeout=60) == 42
        # A fresh handle (no cached meta) reads the stored result until it expires.
        wait_until(
            lambda: app.AsyncResult(added.id).status == "PENDING",
            timeout=30,
            what="the result to expire",
        )
        wait_until(lambda: broker.reap()["results_trimmed"] > 0, timeout=30, what="the trim")
        key = f"celery-task-meta-{added.id}"
        assert broker.backend.task_result_get_many(keys=[key]) == {}
        assert broker.backend.task_result_delete(keys=[key]) == 0, "the row is gone"
    finally:
        started.close()
        app.close()


def test_results_are_kept_for_result_expires_or_the_broker_result_ttl(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    app = _client(backend_url, 3600)
    app.conf.result_expires = None
    app.conf.result_backend_transport_options = {"broker_options": {"result_ttl": 120}}
    try:
        backend = app.backend
        assert isinstance(backend, ResultBackend)
        assert backend._ttl(backend.expires) == 120, "never kept without bound"
        backend.store_result("a-task-id", {"total": 3}, "SUCCESS")
        assert app.AsyncResult("a-task-id").get(timeout=1) == {"total": 3}
        app.AsyncResult("a-task-id").forget()
        assert app.AsyncResult("a-task-id").status == "PENDING"
    finally:
        app.close()


def test_expired_results_are_deleted_by_the_backend_itself(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """No reaper and no Celery beat: storing results deletes expired ones as it goes."""
    app = _client(backend_url, 0.05)
    try:
        backend = app.backend
        assert isinstance(backend, ResultBackend)
        backend.trim_every = 3
        backend.store_result("old", 1, "SUCCESS")
        old_key = "celery-task-meta-old"
        wait_until(lambda: app.AsyncResult("old").status == "PENDING", timeout=30, what="expiry")
        backend.expires = 3600
        backend.store_result("new-1", 2, "SUCCESS")
        backend.store_result("new-2", 3, "SUCCESS")
        assert broker.backend.task_result_delete(keys=[old_key]) == 0, "trimmed by the 3rd"
        backend.expires = 0.05
        backend.store_result("expiring", 4, "SUCCESS")
        wait_until(
            lambda: app.AsyncResult("expiring").status == "PENDING", timeout=30, what="expiry"
        )
        backend.cleanup()  # what Celery beat's backend_cleanup runs
        assert broker.backend.task_result_delete(keys=["celery-task-meta-expiring"]) == 0
        assert app.AsyncResult("new-1").get(timeout=1) == 2
    finally:
        app.close()


def test_a_key_too_long_for_either_database_is_refused_before_any_sql(
    client: Celery, broker: sqlbroker.Broker
) -> None:
    backend = client.backend
    longest = "é" * 512  # 1 KB of UTF-8: stored alike on both backends
    backend.set(longest, b"kept")
    assert backend.get(longest) == b"kept"
    before = table_counts(broker.backend)
    for key in ("k" * 3000, b"k" * 3000, "", b"\xff\xfe"):
        with pytest.raises(sqlbroker.InvalidOption, match="key"):
            backend.set(key, b"lost")
    assert table_counts(broker.backend) == before


def test_bad_configuration_is_one_clear_error(broker: sqlbroker.Broker, backend_url: str) -> None:
    app = _client(backend_url, 3600)
    app.conf.result_backend_transport_options = {"visibility": 3}
    with pytest.raises(sqlbroker.InvalidOption, match="unknown option"):
        _ = app.backend
    other = Celery("shop", backend=f"{SCHEME}+mysql://db/app", set_as_current=False)
    with pytest.raises(sqlbroker.InvalidURL):
        _ = other.backend


def _result_watches(broker: sqlbroker.Broker) -> int:
    """Result watches open in this process (watcher threads) or on this database (LISTEN
    connections of the result hub)."""
    threads = sum(thread.name == "sqlbroker-result" for thread in threading.enumerate())
    if broker.backend_name == "sqlite":
        return threads
    with broker.backend.begin() as tx:
        row = tx.connection.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %%_result%%'"
        ).fetchone()
    return threads + int(row[0])


def test_closing_the_app_closes_the_backends_watch(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """``app.close()`` (or ``with Celery(...)``) closes the result backend's broker: a
    ``get()`` that waited leaves no watcher thread (SQLite) nor LISTEN connection
    (PostgreSQL) behind."""
    before = _result_watches(broker)
    with _client(backend_url, 3600) as app:
        waiting = app.AsyncResult("a-waited-task")

        def store_once_watched() -> None:
            wait_until(
                lambda: _result_watches(broker) > before, timeout=30, what="the result watch"
            )
            app.backend.mark_as_done("a-waited-task", 7)

        storing = threading.Thread(target=store_once_watched)
        storing.start()
        assert waiting.get(timeout=30) == 7
        storing.join()
    wait_until(lambda: _result_watches(broker) == before, timeout=30, what="the watch to close")
