"""Dead-letter reasons, error messages and tracebacks are stored truncated to documented
bounds (docs/security.md), however they were produced: a handler's exception, a
``Reject(reason)`` or a hand-made ``ErrorInfo`` passed to ``dead_letter``."""

from __future__ import annotations

from typing import Any

import sqlbroker
from sqlbroker.core.message import ErrorInfo
from sqlbroker.core.validate import MAX_REASON

HUGE = "x" * 200_000


def _deep(depth: int) -> None:
    if depth == 0:
        raise ValueError(HUGE)
    _deep(depth - 1)


def _bounded(dead: Any) -> None:
    assert len(dead.reason) <= MAX_REASON
    assert dead.error_message is None or len(dead.error_message) <= ErrorInfo.MAX_MESSAGE
    assert dead.error_type is None or len(dead.error_type) <= ErrorInfo.MAX_TYPE
    if dead.traceback is not None:
        assert len(dead.traceback) <= ErrorInfo.MAX_TRACEBACK + len(ErrorInfo.TRUNCATED)


def test_worker_failures_are_stored_truncated(backend_url: str) -> None:
    app = sqlbroker.app.Broker(backend_url, migrate=True)

    @app.subscriber(queue="deep", retry=sqlbroker.RetryPolicy(max_attempts=1))
    def deep(message: Any) -> None:
        _deep(200)

    @app.subscriber(queue="rejects")
    def rejects(message: Any) -> None:
        raise sqlbroker.Reject(HUGE)

    try:
        app.send("deep", 1)
        app.send("rejects", 1)
        app.run_until_idle(timeout=60)
        dead = app.dead_letters.list()
    finally:
        app.close()
    assert len(dead) == 2
    for letter in dead:
        _bounded(letter)
    (deep_letter,) = [d for d in dead if d.subscription == "deep"]
    assert deep_letter.traceback is not None
    assert deep_letter.traceback.startswith(ErrorInfo.TRUNCATED)
    assert deep_letter.traceback.rstrip().endswith("x")  # the tail, with the exception line


def test_hand_made_errors_are_stored_truncated(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    (delivery,) = broker.claim("q")
    error = ErrorInfo(type=HUGE, message=HUGE, traceback=HUGE)
    broker.dead_letter(delivery, reason=HUGE, error=error)
    (dead,) = broker.dead_letters.list()
    _bounded(dead)
