"""A saga whose steps nothing handles waits forever: starting it, or running a worker for
it, says so loudly (a log warning and a ``SagaWarning``) — and stays quiet when every step
has a handler here or in a live worker, since handlers may live in other processes."""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import sqlbroker
from runtime.support import run_until_idle, wait_until
from sqlbroker import Saga, SagaStatus, Step, StepContext

CHECKOUT = Saga("checkout", [Step("reserve"), Step("charge"), Step("ship", compensate=False)])


def _register(broker: sqlbroker.Broker, *, only: str | None = None) -> None:
    """The checkout's handlers (only those of step ``only`` when given)."""
    for step in CHECKOUT.steps:
        if only is not None and step.name != only:
            continue

        def action(ctx: StepContext, name: str = step.name) -> dict[str, str]:
            return {"done": name}

        broker.saga_step(CHECKOUT, step.name)(action)
        if step.compensate:
            broker.saga_compensation(CHECKOUT, step.name)(lambda ctx: None)


@pytest.fixture
def app(backend_url: str) -> Iterator[sqlbroker.Broker]:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        yield broker


def test_starting_a_saga_with_unhandled_steps_warns_once(
    app: sqlbroker.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """The README's old snippet: three steps, one handled."""
    _register(app, only="charge")
    caplog.set_level(logging.WARNING, logger="sqlbroker.sagas")
    with pytest.warns(sqlbroker.SagaWarning) as warned:
        app.sagas.start(CHECKOUT, {"order": 1})
    (warning,) = warned
    text = str(warning.message)
    for queue in ("saga.checkout.reserve", "saga.checkout.reserve.undo", "saga.checkout.ship"):
        assert queue in text
    assert "saga.checkout.charge," not in text
    assert "saga.checkout.charge.undo" not in text
    assert warning.filename == __file__, "the warning points at the caller's start()"
    assert [r.getMessage() for r in caplog.records] == [text]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        app.sagas.start(CHECKOUT, {"order": 2})  # said once per saga: no flood


def test_a_worker_for_a_saga_with_unhandled_steps_warns(
    app: sqlbroker.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    _register(app, only="reserve")
    caplog.set_level(logging.WARNING, logger="sqlbroker.sagas")
    with pytest.warns(sqlbroker.SagaWarning, match="this worker runs saga 'checkout'"):
        run_until_idle(app)
    assert any("saga.checkout.charge" in r.getMessage() for r in caplog.records)


def test_a_fully_handled_saga_starts_and_runs_without_a_warning(app: sqlbroker.Broker) -> None:
    _register(app)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saga_id = app.sagas.start(CHECKOUT, {"order": 1})
        run_until_idle(app)
    assert app.sagas.get(saga_id).status is SagaStatus.COMPLETED


def test_handlers_in_a_live_worker_elsewhere_count(app: sqlbroker.Broker, backend_url: str) -> None:
    """A producer without handlers (a web app) starts sagas a worker process handles."""
    _register(app)
    runner = threading.Thread(
        target=app.run, kwargs={"install_signal_handlers": False, "timeout": 60}, daemon=True
    )
    runner.start()
    try:
        wait_until(
            lambda: any(w.stopped_at is None for w in app.workers()),
            timeout=30,
            what="the worker's first heartbeat",
        )
        with sqlbroker.Broker(backend_url) as producer, warnings.catch_warnings():
            warnings.simplefilter("error")
            saga_id = producer.sagas.start(CHECKOUT, {"order": 1})
        wait_until(
            lambda: app.sagas.get(saga_id).status is SagaStatus.COMPLETED,
            timeout=30,
            what="the saga to complete",
        )
    finally:
        app.stop()
        runner.join(30)
    assert not runner.is_alive()


def test_an_async_worker_checks_its_sagas_off_the_callers_loop(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AsyncBroker.run_until_idle`` with a step unhandled here warns as the blocking face
    does, and its look at the live workers (a blocking read) runs on the backend's own
    threads, not on the caller's loop (which it would stall meanwhile)."""
    readers: list[int] = []

    async def scenario() -> int:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            _register(broker, only="reserve")
            backend = broker.backend
            real = backend.worker_list

            def worker_list() -> Any:
                readers.append(threading.get_ident())
                return real()

            monkeypatch.setattr(backend, "worker_list", worker_list)
            with pytest.warns(sqlbroker.SagaWarning, match="this worker runs saga 'checkout'"):
                await broker.run_until_idle(timeout=30)
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert readers, "the check looked at the live workers"
    assert loop_thread not in readers
