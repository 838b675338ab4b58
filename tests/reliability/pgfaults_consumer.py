"""A worker process of a fault scenario, writing its history; started by ``pgfaults.consumer``.

Run as ``python -m reliability.pgfaults_consumer`` with ``tests/`` on ``PYTHONPATH``. One
queue subscriber whose handler sleeps ``SQLBROKER_SLEEP`` seconds; the history observer
records every delivery and settled outcome. It runs until SIGTERM (exit 0) and exits 3 if
the worker crashed (a task of it died).

Environment: ``SQLBROKER_URL``, ``SQLBROKER_HISTORY`` (directory), ``SQLBROKER_NAME``,
``SQLBROKER_READY`` (created once the worker runs), ``SQLBROKER_QUEUE`` (``jobs``),
``SQLBROKER_CONCURRENCY`` (4), ``SQLBROKER_POLL_INTERVAL`` (1), ``SQLBROKER_LISTEN``
(``1``; ``0`` runs without a wake-up listener), ``SQLBROKER_LEASE`` (30),
``SQLBROKER_SLEEP`` (0), ``SQLBROKER_APPLICATION_NAME`` (PostgreSQL's, to find its
sessions), ``SQLBROKER_TIME_CLAIMS`` (``1``: record each claim's duration as a ``claim``
event with ``seconds`` and ``found``), ``SQLBROKER_NETWORK_TIMEOUT`` (the broker's
``network_timeout``, PostgreSQL only), ``SQLBROKER_POOLER`` and ``SQLBROKER_LISTEN_URL``
(the broker's ``pooler`` and ``listen_url``, PostgreSQL only).
"""

from __future__ import annotations

import asyncio
import faulthandler
import functools
import logging
import os
import signal
import sys
import time
from typing import Any

import sqlbroker
from reliability.history import HistoryObserver, HistoryWriter
from runtime.workerapp import _ReadyMarker


def _timed_claims(backend: Any, writer: HistoryWriter) -> None:
    """Wrap the backend's claim (the real call, on the real database) to time it."""
    claim = backend.async_ops.message_claim_many

    @functools.wraps(claim)
    async def timed(**options: Any) -> Any:
        started = time.perf_counter()
        found = await claim(**options)
        writer.record("claim", seconds=time.perf_counter() - started, found=len(found))
        return found

    backend.async_ops.message_claim_many = timed


def main() -> int:
    faulthandler.register(signal.SIGUSR1)  # a stuck worker's stacks, for the test's report
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("sqlbroker.runtime").addHandler(_ReadyMarker(os.environ["SQLBROKER_READY"]))
    env = os.environ.get
    url = os.environ["SQLBROKER_URL"]
    writer = HistoryWriter(os.environ["SQLBROKER_HISTORY"], env("SQLBROKER_NAME", "consumer"))
    options: dict[str, Any] = {}
    if not url.startswith("sqlite") and env("SQLBROKER_APPLICATION_NAME"):
        options["application_name"] = env("SQLBROKER_APPLICATION_NAME")
    if not url.startswith("sqlite") and env("SQLBROKER_NETWORK_TIMEOUT"):
        options["network_timeout"] = float(env("SQLBROKER_NETWORK_TIMEOUT", "30"))
    if not url.startswith("sqlite") and env("SQLBROKER_POOLER"):
        options["pooler"] = env("SQLBROKER_POOLER")
    if not url.startswith("sqlite") and env("SQLBROKER_LISTEN_URL"):
        options["listen_url"] = env("SQLBROKER_LISTEN_URL")
    broker = sqlbroker.Broker(url, lease=float(env("SQLBROKER_LEASE", "30")), **options)
    broker.add_observer(HistoryObserver(writer))
    if env("SQLBROKER_TIME_CLAIMS") == "1":
        _timed_claims(broker.backend, writer)
    seconds = float(env("SQLBROKER_SLEEP", "0"))

    @broker.subscriber(
        queue=env("SQLBROKER_QUEUE", "jobs"),
        concurrency=int(env("SQLBROKER_CONCURRENCY", "4")),
        timeout=None,
    )
    async def handle(msg: sqlbroker.Message) -> None:
        if seconds:
            await asyncio.sleep(seconds)

    try:
        broker.run(
            poll_interval=float(env("SQLBROKER_POLL_INTERVAL", "1")),
            listen=env("SQLBROKER_LISTEN", "1") == "1",
        )
    except sqlbroker.WorkerCrashed:
        logging.getLogger("consumer").exception("the worker crashed")
        return 3
    finally:
        broker.close()
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
