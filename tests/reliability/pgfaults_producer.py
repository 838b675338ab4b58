"""A publishing process of a fault scenario, writing its history; started by
``pgfaults.producer``.

Run as ``python -m reliability.pgfaults_producer`` with ``tests/`` on ``PYTHONPATH``. It
sends ``SQLBROKER_COUNT`` messages ``{"tag": "<prefix>-<n>"}`` to a queue at
``SQLBROKER_RATE`` per second, each with its tag as idempotency key. A publish that fails
(``ConnectionLost``, ambiguous or not, or any other error) is recorded and tried again with
the same key until it succeeds, so a retry of a publish that did commit finds the original.

Every ``SQLBROKER_ROLLBACK_EVERY``-th message is instead published inside a transaction of
the producer's own driver connection (``conn=``) that it then rolls back: it is recorded as
``failed`` (definitely not applied) and never retried, so the checker reports it if it
exists. Every ``SQLBROKER_TX_EVERY``-th is published inside such a transaction that commits.

Environment: ``SQLBROKER_URL``, ``SQLBROKER_HISTORY``, ``SQLBROKER_NAME``, ``SQLBROKER_READY``
(created once the broker is open), ``SQLBROKER_QUEUE`` (``jobs``), ``SQLBROKER_COUNT``,
``SQLBROKER_RATE`` (messages per second), ``SQLBROKER_PREFIX`` (the name), ``SQLBROKER_TX_EVERY``
and ``SQLBROKER_ROLLBACK_EVERY`` (0: never), ``SQLBROKER_APPLICATION_NAME``,
``SQLBROKER_GIVE_UP`` (seconds one message is retried before the producer exits 4; 120),
``SQLBROKER_BATCH`` (1: each message alone with ``send``; more: that many in one
``publish_many``), ``SQLBROKER_BURST`` (publish that many back to back, then pause: the
same rate on average, with quiet gaps), ``SQLBROKER_STOP_FILE`` (stop early, cleanly,
once this file exists), ``SQLBROKER_POOLER`` (the broker's ``pooler``: also its own
driver connections then prepare nothing), ``SQLBROKER_PAD`` (that many bytes of padding
in each payload's ``pad``; 0). Exit status 0 once every message was published.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import sqlbroker
from reliability.history import HistoryWriter


class Producer:
    def __init__(self) -> None:
        env = os.environ.get
        self.url = os.environ["SQLBROKER_URL"]
        self.name = env("SQLBROKER_NAME", "producer")
        self.writer = HistoryWriter(os.environ["SQLBROKER_HISTORY"], self.name)
        self.queue = env("SQLBROKER_QUEUE", "jobs")
        self.application_name = env("SQLBROKER_APPLICATION_NAME") or None
        options: dict[str, Any] = {}
        if not self.url.startswith("sqlite") and self.application_name:
            options["application_name"] = self.application_name
        self.pooler = env("SQLBROKER_POOLER") or None
        if self.pooler:
            options["pooler"] = self.pooler
        self.broker = sqlbroker.Broker(self.url, **options)
        self.give_up = float(env("SQLBROKER_GIVE_UP", "120"))
        self.pad = "x" * int(env("SQLBROKER_PAD", "0"))

    def payload(self, tag: str) -> dict[str, str]:
        return {"tag": tag, "pad": self.pad} if self.pad else {"tag": tag}

    def _driver_connection(self) -> Any:
        if self.url.startswith("sqlite"):
            path = self.url.split("///", 1)[1].split("?", 1)[0]
            return sqlite3.connect(path, isolation_level=None, timeout=30)
        import psycopg

        return psycopg.connect(
            self.url,
            application_name=self.application_name or "producer",
            prepare_threshold=None if self.pooler == "transaction" else 5,
        )

    def publish(self, *tags: str) -> None:
        """Publish until it succeeds, the same idempotency keys every time: one tag with
        ``send``, several in one ``publish_many``."""
        deadline = time.monotonic() + self.give_up
        pause = 0.02
        while True:
            try:
                if len(tags) == 1:
                    ids = [
                        self.broker.send(self.queue, self.payload(tags[0]), idempotency_key=tags[0])
                    ]
                else:
                    ids = self.broker.publish_many(
                        {"topic": self.queue, "payload": self.payload(tag), "idempotency_key": tag}
                        for tag in tags
                    )
            except Exception as error:
                for tag in tags:
                    self.writer.publish_failed(tag, error, ikey=tag)
                if time.monotonic() > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
            else:
                for tag, message_id in zip(tags, ids, strict=True):
                    self.writer.published(tag, message_id, ikey=tag)
                return

    def publish_in_transaction(self, tag: str, *, commit: bool) -> None:
        """Publish inside a transaction of our own connection, then commit or roll back. A
        committed one whose commit failed is retried through :meth:`publish`."""
        try:
            conn = self._driver_connection()
        except Exception as error:
            self.writer.record("publish", tag=tag, ikey=tag, status="failed", error=repr(error))
            if commit:
                self.publish(tag)
            return
        try:
            if isinstance(conn, sqlite3.Connection):
                conn.execute("BEGIN")
            try:
                message_id = self.broker.send(
                    self.queue, self.payload(tag), idempotency_key=tag, conn=conn
                )
            except Exception as error:
                self.writer.publish_failed(tag, error, ikey=tag)
                _quietly(conn.rollback)
                if commit:
                    self.publish(tag)
                return
            if not commit:
                conn.rollback()
                self.writer.record(
                    "publish", tag=tag, ikey=tag, status="failed", error="rolled back on purpose"
                )
                return
            try:
                conn.commit()
            except Exception as error:
                # The driver's own commit: its fate is unknown, so try again with the key.
                self.writer.record(
                    "publish", tag=tag, ikey=tag, status="ambiguous", error=repr(error)
                )
                self.publish(tag)
                return
            self.writer.published(tag, message_id, ikey=tag)
        finally:
            _quietly(conn.close)

    def run(self) -> None:
        env = os.environ.get
        count = int(env("SQLBROKER_COUNT", "1000000"))
        rate = float(env("SQLBROKER_RATE", "50"))
        prefix = env("SQLBROKER_PREFIX", self.name)
        tx_every = int(env("SQLBROKER_TX_EVERY", "0"))
        rollback_every = int(env("SQLBROKER_ROLLBACK_EVERY", "0"))
        batch = int(env("SQLBROKER_BATCH", "1"))
        burst = int(env("SQLBROKER_BURST", "1"))
        stop_file = Path(env("SQLBROKER_STOP_FILE") or "/nonexistent/stop")
        Path(os.environ["SQLBROKER_READY"]).touch()
        started = time.monotonic()
        pending: list[str] = []
        for index in range(count):
            if not pending and stop_file.exists():
                break
            wait = started + (index - index % burst) / rate - time.monotonic()
            if wait > 0 and not pending:
                time.sleep(wait)
            tag = f"{prefix}-{index}"
            if rollback_every and index % rollback_every == rollback_every - 1:
                self.publish_in_transaction(tag, commit=False)
            elif tx_every and index % tx_every == tx_every - 1:
                self.publish_in_transaction(tag, commit=True)
            else:
                pending.append(tag)
                if len(pending) >= batch or index == count - 1:
                    self.publish(*pending)
                    pending = []
        if pending:
            self.publish(*pending)

    def close(self) -> None:
        self.broker.close()
        self.writer.close()


def _quietly(action: Any) -> None:
    """Roll back or close a connection that may be broken: it may refuse even that."""
    with contextlib.suppress(Exception):
        action()


def main() -> int:
    producer = Producer()
    try:
        producer.run()
    except Exception:
        import traceback

        traceback.print_exc()
        return 4
    finally:
        producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
