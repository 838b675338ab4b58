"""A real worker process for the runtime tests, configured by environment variables.

Run as ``python -m runtime.workerapp`` with ``tests/`` on ``PYTHONPATH`` (see
``tests/runtime/conftest.py``). One queue subscriber whose behaviour is driven by each
message's payload, a JSON object:

- ``id``: the name recorded in the effects file;
- ``sleep``: seconds the handler takes (default 0);
- ``hang`` / ``hang_attempts``: take ``hang`` seconds instead while the attempt number is at
  most ``hang_attempts`` (a handler stuck on its first delivery, say), or while the file
  ``hang_until`` does not exist;
- ``fail_attempts``: raise while the attempt number is at most this;
- ``exit_attempts``: ``os._exit(1)`` while the attempt number is at most this (a message
  that kills its worker; use a large number for "always").

Every handler call appends JSON lines to ``SQLBROKER_EFFECTS``: ``start`` when it begins
and ``finish`` (or ``fail``) when it ends, each with the message id, attempt, delivery id
and process id. ``SQLBROKER_READY`` is created once the worker's tasks are running.

Environment: ``SQLBROKER_URL`` (required), ``SQLBROKER_QUEUE`` (``jobs``),
``SQLBROKER_HANDLER`` (``async`` or ``sync``), ``SQLBROKER_MODE`` (``run`` or
``until-idle``), ``SQLBROKER_LEASE``, ``SQLBROKER_CONCURRENCY``, ``SQLBROKER_PREFETCH``,
``SQLBROKER_GRACE``, ``SQLBROKER_REAP_INTERVAL``, ``SQLBROKER_POLL_INTERVAL``,
``SQLBROKER_TIMEOUT`` (seconds; the run's overall limit), ``SQLBROKER_MAX_ATTEMPTS``
(the retry policy's), ``SQLBROKER_RETRY_BASE``, ``SQLBROKER_EFFECTS_TABLE`` (when set, the
handler also inserts ``(message_id, attempt, pid)`` into the table ``app_effects`` through
``msg.transaction()`` and takes its ``sleep`` inside that transaction).

Exit status: 0 after a clean stop, 3 when the worker crashed (``WorkerCrashed``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import sqlbroker

READY_LOG_PREFIX = "worker %s running"


class Effects:
    """Appends one JSON line per event; each line is one ``write`` on an ``O_APPEND`` file,
    so lines from several processes never interleave."""

    def __init__(self, path: str | None) -> None:
        self._fd = (
            None if not path else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        )

    def record(self, event: str, msg: sqlbroker.Message, **extra: Any) -> None:
        if self._fd is None:
            return
        line = {
            "event": event,
            "id": msg.payload.get("id") if isinstance(msg.payload, dict) else None,
            "message_id": msg.id,
            "delivery_id": msg.delivery_id,
            "attempt": msg.attempt,
            "pid": os.getpid(),
            "time": time.time(),
            **extra,
        }
        os.write(self._fd, (json.dumps(line) + "\n").encode())


class _ReadyMarker(logging.Handler):
    """Creates the ready file when the worker logs that its tasks are running."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self._path = path

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith(READY_LOG_PREFIX):
            Path(self._path).touch()


def _number(name: str) -> float | None:
    value = os.environ.get(name)
    return None if value in (None, "") else float(value)


def _plan(msg: sqlbroker.Message) -> tuple[dict[str, Any], float]:
    spec: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
    if msg.attempt <= int(spec.get("exit_attempts", 0)):
        os._exit(1)
    if msg.attempt <= int(spec.get("hang_attempts", 0)):
        return spec, float(spec.get("hang", 60.0))
    if "hang_until" in spec and not os.path.exists(spec["hang_until"]):
        return spec, float(spec.get("hang", 60.0))
    return spec, float(spec.get("sleep", 0.0))


def build() -> tuple[sqlbroker.Broker, dict[str, Any]]:
    """The broker with its one subscriber, and the options for running it."""
    url = os.environ["SQLBROKER_URL"]
    queue = os.environ.get("SQLBROKER_QUEUE", "jobs")
    lease = _number("SQLBROKER_LEASE")
    broker = sqlbroker.Broker(url, **({} if lease is None else {"lease": lease}))
    effects = Effects(os.environ.get("SQLBROKER_EFFECTS"))
    max_attempts = _number("SQLBROKER_MAX_ATTEMPTS")
    retry = sqlbroker.RetryPolicy(
        max_attempts=None if max_attempts is None else int(max_attempts),
        base=_number("SQLBROKER_RETRY_BASE") or 0.05,
        cap=1.0,
    )
    concurrency = int(_number("SQLBROKER_CONCURRENCY") or 2)
    prefetch = _number("SQLBROKER_PREFETCH")
    options: dict[str, Any] = {
        "concurrency": concurrency,
        "prefetch": None if prefetch is None else int(prefetch),
        "retry": retry,
        "timeout": None,
    }

    def fail(msg: sqlbroker.Message, spec: dict[str, Any]) -> None:
        if msg.attempt <= int(spec.get("fail_attempts", 0)):
            effects.record("fail", msg)
            raise RuntimeError(f"failing attempt {msg.attempt} on purpose")
        effects.record("finish", msg)

    in_transaction = bool(os.environ.get("SQLBROKER_EFFECTS_TABLE"))
    row = (
        "INSERT INTO app_effects (message_id, attempt, pid) VALUES (?, ?, ?)"
        if url.startswith("sqlite")
        else "INSERT INTO app_effects (message_id, attempt, pid) VALUES (%s, %s, %s)"
    )

    if in_transaction and os.environ.get("SQLBROKER_HANDLER", "async") == "sync":

        @broker.subscriber(queue=queue, **options)
        def handle_in_transaction_sync(msg: sqlbroker.Message) -> None:
            effects.record("start", msg)
            spec, seconds = _plan(msg)
            with msg.transaction() as conn:
                conn.execute(row, (msg.id, msg.attempt, os.getpid()))
                time.sleep(seconds)
                fail(msg, spec)

    elif in_transaction:

        @broker.subscriber(queue=queue, **options)
        async def handle_in_transaction_async(msg: sqlbroker.Message) -> None:
            effects.record("start", msg)
            spec, seconds = _plan(msg)
            async with msg.transaction() as conn:
                result = conn.execute(row, (msg.id, msg.attempt, os.getpid()))
                if asyncio.iscoroutine(result):
                    await result
                await asyncio.sleep(seconds)
                fail(msg, spec)

    elif os.environ.get("SQLBROKER_HANDLER", "async") == "sync":

        @broker.subscriber(queue=queue, **options)
        def handle_sync(msg: sqlbroker.Message) -> None:
            effects.record("start", msg)
            spec, seconds = _plan(msg)
            time.sleep(seconds)
            fail(msg, spec)

    else:

        @broker.subscriber(queue=queue, **options)
        async def handle_async(msg: sqlbroker.Message) -> None:
            effects.record("start", msg)
            spec, seconds = _plan(msg)
            await asyncio.sleep(seconds)
            fail(msg, spec)

    run_options: dict[str, Any] = {}
    for option, variable in (
        ("grace", "SQLBROKER_GRACE"),
        ("reap_interval", "SQLBROKER_REAP_INTERVAL"),
        ("poll_interval", "SQLBROKER_POLL_INTERVAL"),
        ("timeout", "SQLBROKER_TIMEOUT"),
    ):
        value = _number(variable)
        if value is not None:
            run_options[option] = value
    return broker, run_options


def main() -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )
    ready = os.environ.get("SQLBROKER_READY")
    if ready:
        logging.getLogger("sqlbroker.runtime").addHandler(_ReadyMarker(ready))
    broker, run_options = build()
    try:
        if os.environ.get("SQLBROKER_MODE", "run") == "until-idle":
            broker.run_until_idle(install_signal_handlers=True, **run_options)
        else:
            broker.run(**run_options)
    except sqlbroker.WorkerCrashed:
        logging.getLogger("workerapp").exception("the worker crashed")
        return 3
    finally:
        broker.close()
    logging.getLogger("workerapp").info("exiting cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
