"""Failures the state machine and the fuzzers found, kept as plain tests.

State-machine regressions replay the shrunk step list on ``BrokerMachine`` (each rule
checks its own result, and ``database_matches_the_model`` the whole database); fuzzer
regressions call the entry point with the input that escaped validation.
"""

from __future__ import annotations

from properties.machine import BrokerMachine


def test_a_duplicate_send_does_not_create_its_queue(backend_url: str) -> None:
    """SQLite created the queue of a ``send`` whose idempotency key made it a duplicate of
    an unrouted publish to the same topic: a duplicate must write nothing (PostgreSQL
    wrote nothing)."""
    state = BrokerMachine.for_url(backend_url)()
    try:
        state.publish(
            topic="q",
            payload=0,
            priority=2,
            key=None,
            delay=None,
            ttl=None,
            max_attempts=None,
            idempotency_key="i1",
            dedupe_window=None,
        )
        state.database_matches_the_model()
        state.send(
            payload=0,
            priority=2,
            key=None,
            delay=None,
            ttl=None,
            max_attempts=None,
            idempotency_key="i1",
        )
        state.database_matches_the_model()
        assert "q" not in {s.name for s in state.broker.subscriptions()}
    finally:
        state.teardown()
