"""A worker process for the reliability scenarios, keeping its own history.

Run as ``python -m reliability.app`` with ``tests/`` on ``PYTHONPATH`` (``Fleet.worker``
in ``processes.py`` does). It runs one subscriber per queue and records every delivery
and every committed or refused outcome through a :class:`HistoryObserver` to
``SQLBROKER_HISTORY/<SQLBROKER_NAME>-<pid>.jsonl``. What a handler does is driven by the
message's payload, a JSON object:

- ``tag``: the producer's name for the message (the history and the checker key on it);
- ``sleep``: seconds the handler takes (default 0);
- ``exit``: ``os._exit(1)`` while the attempt number is at most this (a message that kills
  its worker; a large number for "always"). The process records a ``fault`` of kind
  ``exit`` against itself first, so the checker can explain the redelivery;
- ``raise``: raise ``RuntimeError`` while the attempt number is at most this;
- ``hang``: sleep ``hang_seconds`` (default an hour) while the attempt number is at most
  this: a handler stuck past its subscriber's timeout, which cancels it.

Environment: ``SQLBROKER_URL`` and ``SQLBROKER_HISTORY`` (required), ``SQLBROKER_NAME``
(``worker``), ``SQLBROKER_QUEUES`` (comma-separated, ``jobs``), ``SQLBROKER_HANDLER``
(``async`` or ``sync``), ``SQLBROKER_MODE`` (``run`` or ``until-idle``),
``SQLBROKER_LEASE``, ``SQLBROKER_CONCURRENCY`` (8), ``SQLBROKER_PREFETCH``,
``SQLBROKER_HANDLER_TIMEOUT`` (seconds; none by default), ``SQLBROKER_MAX_ATTEMPTS``,
``SQLBROKER_RETRY_BASE`` (0.05 s), ``SQLBROKER_GRACE``, ``SQLBROKER_REAP_INTERVAL``,
``SQLBROKER_POLL_INTERVAL``, ``SQLBROKER_TIMEOUT`` (the run's overall limit),
``SQLBROKER_READY`` (a file created once the worker's tasks run).

Exit status: 0 after a clean stop, 3 when the worker crashed (``WorkerCrashed``), 1 when a
handler's ``exit`` fired.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Any

import sqlbroker
from reliability.history import HistoryObserver, HistoryWriter
from runtime.workerapp import _ReadyMarker

log = logging.getLogger("reliability.app")


def number(name: str) -> float | None:
    """The environment variable ``name`` as a number, ``None`` when unset or empty."""
    value = os.environ.get(name)
    return None if value in (None, "") else float(value)


class Behaviour:
    """What a handler does with one delivery, decided from its payload and attempt."""

    def __init__(self, writer: HistoryWriter) -> None:
        self._writer = writer

    def plan(self, msg: sqlbroker.Message) -> float:
        """Exit or raise now as the payload asks; otherwise return the seconds to take."""
        spec: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
        if msg.attempt <= int(spec.get("exit", 0)):
            self._writer.fault("exit", os.getpid())
            os._exit(1)
        if msg.attempt <= int(spec.get("raise", 0)):
            raise RuntimeError(f"poison: failing attempt {msg.attempt} on purpose")
        if msg.attempt <= int(spec.get("hang", 0)):
            return float(spec.get("hang_seconds", 3600.0))
        return float(spec.get("sleep", 0.0))


def build(writer: HistoryWriter) -> tuple[sqlbroker.Broker, dict[str, Any]]:
    """The broker with one subscriber per queue, observed by the history, and the options
    for running it."""
    lease = number("SQLBROKER_LEASE")
    broker = sqlbroker.Broker(
        os.environ["SQLBROKER_URL"], **({} if lease is None else {"lease": lease})
    )
    broker.add_observer(HistoryObserver(writer))
    behaviour = Behaviour(writer)
    max_attempts = number("SQLBROKER_MAX_ATTEMPTS")
    prefetch = number("SQLBROKER_PREFETCH")
    options: dict[str, Any] = {
        "concurrency": int(number("SQLBROKER_CONCURRENCY") or 8),
        "prefetch": None if prefetch is None else int(prefetch),
        "timeout": number("SQLBROKER_HANDLER_TIMEOUT"),
        "retry": sqlbroker.RetryPolicy(
            max_attempts=None if max_attempts is None else int(max_attempts),
            base=number("SQLBROKER_RETRY_BASE") or 0.05,
            cap=1.0,
        ),
    }
    sync = os.environ.get("SQLBROKER_HANDLER", "async") == "sync"
    for queue in os.environ.get("SQLBROKER_QUEUES", "jobs").split(","):
        if sync:

            def handle_sync(msg: sqlbroker.Message) -> None:
                seconds = behaviour.plan(msg)
                if seconds:
                    time.sleep(seconds)

            broker.subscriber(queue=queue, **options)(handle_sync)
        else:

            async def handle(msg: sqlbroker.Message) -> None:
                seconds = behaviour.plan(msg)
                if seconds:
                    await asyncio.sleep(seconds)

            broker.subscriber(queue=queue, **options)(handle)

    run_options: dict[str, Any] = {}
    for option in ("grace", "reap_interval", "poll_interval", "timeout"):
        value = number(f"SQLBROKER_{option.upper()}")
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
    writer = HistoryWriter(
        os.environ["SQLBROKER_HISTORY"], os.environ.get("SQLBROKER_NAME", "worker")
    )
    broker, run_options = build(writer)
    try:
        if os.environ.get("SQLBROKER_MODE", "run") == "until-idle":
            broker.run_until_idle(install_signal_handlers=True, **run_options)
        else:
            broker.run(**run_options)
    except sqlbroker.WorkerCrashed:
        log.exception("the worker crashed")
        return 3
    finally:
        broker.close()
        writer.close()
    log.info("exiting cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
