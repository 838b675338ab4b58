"""A producer process for the reliability scenarios, keeping its own history.

Run as ``python -m reliability.producer`` with ``tests/`` on ``PYTHONPATH`` (``Fleet.producer``
in ``processes.py`` does). It publishes ``SQLBROKER_COUNT`` messages to the queue
``SQLBROKER_QUEUE`` in batches (``publish_many``, one transaction each), message ``n``
tagged ``<SQLBROKER_NAME>-<n>`` with the tag as its idempotency key, and records every
outcome in ``SQLBROKER_HISTORY/<SQLBROKER_NAME>-<pid>.jsonl``. A batch that fails, whether
definitely or ambiguously, is published again with the same keys until it succeeds.

A producer killed mid-batch is replaced by starting another with the same name: it reads
its predecessors' histories and publishes every tag none of them saw succeed, the batch
that was in flight included (so a commit the killed one never heard of is found again by
its idempotency key rather than duplicated).

Environment: ``SQLBROKER_URL``, ``SQLBROKER_HISTORY``, ``SQLBROKER_NAME`` (required);
``SQLBROKER_COUNT`` (1000), ``SQLBROKER_BATCH`` (500), ``SQLBROKER_QUEUE`` (``jobs``),
``SQLBROKER_KEYS`` (ordering keys ``<name>/<i>``, message ``n`` on key ``n % keys``; none by
default), ``SQLBROKER_PAYLOAD`` (a JSON object merged into every payload),
``SQLBROKER_OPTIONS`` (a JSON object of publish options for every message: ``delay``,
``ttl``, ``max_attempts``, ...), ``SQLBROKER_PAUSE`` (seconds between batches).

Exit status 0 once every message is published.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import sqlbroker
from reliability.app import number
from reliability.history import HistoryWriter


def tag_of(name: str, index: int) -> str:
    return f"{name}-{index:07d}"


def already_published(directory: str, name: str) -> set[str]:
    """Tags that an earlier producer of this name saw published."""
    done: set[str] = set()
    for path in Path(directory).glob(f"{name}-*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event["op"] == "publish" and event["proc"] == name and event["status"] == "ok":
                done.add(event["tag"])
    return done


def ensure_queue(broker: sqlbroker.Broker, queue: str) -> None:
    """Create the queue (a publish routes by subscription patterns, so it must exist before
    the first), retrying while the database is unavailable."""
    pause = 0.05
    while True:
        try:
            broker.backend.subscription_ensure(name=queue)
            return
        except sqlbroker.SqlbrokerError:
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


class Producer:
    def __init__(self, broker: sqlbroker.Broker, writer: HistoryWriter, name: str) -> None:
        self._broker = broker
        self._writer = writer
        self._name = name
        self._queue = os.environ.get("SQLBROKER_QUEUE", "jobs")
        self._keys = int(number("SQLBROKER_KEYS") or 0)
        self._payload: dict[str, Any] = json.loads(os.environ.get("SQLBROKER_PAYLOAD") or "{}")
        self._options: dict[str, Any] = json.loads(os.environ.get("SQLBROKER_OPTIONS") or "{}")

    def _placement(self, index: int) -> tuple[str | None, int]:
        if not self._keys:
            return None, index
        return f"{self._name}/{index % self._keys}", index // self._keys

    def publish(self, indexes: list[int]) -> None:
        """Publish one batch, again and again until it succeeds."""
        items = []
        for index in indexes:
            tag = tag_of(self._name, index)
            key, _ = self._placement(index)
            item = {
                "topic": self._queue,
                "payload": {**self._payload, "tag": tag},
                "idempotency_key": tag,
                **self._options,
            }
            if key is not None:
                item["key"] = key
            items.append(item)
        pause = 0.05
        while True:
            try:
                ids = self._broker.publish_many(items)
            except Exception as error:
                # A sqlbroker error is recorded as failed or ambiguous, anything else as a
                # foreign error the checker reports; either way the batch goes again.
                for index in indexes:
                    key, seq = self._placement(index)
                    self._writer.publish_failed(
                        tag_of(self._name, index),
                        error,
                        key=key,
                        seq=seq,
                        ikey=tag_of(self._name, index),
                        subs=[self._queue],
                    )
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            for index, message_id in zip(indexes, ids, strict=True):
                key, seq = self._placement(index)
                tag = tag_of(self._name, index)
                self._writer.published(
                    tag, message_id, key=key, seq=seq, ikey=tag, subs=[self._queue]
                )
            return


def main() -> int:
    directory = os.environ["SQLBROKER_HISTORY"]
    name = os.environ["SQLBROKER_NAME"]
    count = int(number("SQLBROKER_COUNT") or 1000)
    batch = int(number("SQLBROKER_BATCH") or 500)
    pause = number("SQLBROKER_PAUSE") or 0.0
    done = already_published(directory, name)
    writer = HistoryWriter(directory, name)
    with sqlbroker.Broker(os.environ["SQLBROKER_URL"]) as broker:
        ensure_queue(broker, os.environ.get("SQLBROKER_QUEUE", "jobs"))
        producer = Producer(broker, writer, name)
        ready = os.environ.get("SQLBROKER_READY")
        if ready:
            Path(ready).touch()
        remaining = [index for index in range(count) if tag_of(name, index) not in done]
        for start in range(0, len(remaining), batch):
            producer.publish(remaining[start : start + batch])
            if pause:
                time.sleep(pause)
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
