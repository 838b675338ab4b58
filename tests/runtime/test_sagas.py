"""Sagas run by real workers on both backends: success, a compensated failure, a failing
compensation, and worker processes SIGKILLed in a loop while many sagas run."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlbroker
from helpers import RefusingExecutor
from runtime import sagaapp
from runtime.support import TESTS_DIR, run_until_idle, wait_until
from sqlbroker import Saga, SagaStatus, Step, StepContext, StepStatus


@pytest.fixture
def app(backend_url: str) -> Iterator[sqlbroker.Broker]:
    broker = sagaapp.build(backend_url, max_attempts=3)
    sagaapp.create_table(backend_url)
    yield broker
    broker.close()


def test_a_saga_completes_and_its_steps_see_earlier_outputs(
    app: sqlbroker.Broker, backend_url: str
) -> None:
    saga_id = app.sagas.start(sagaapp.CHECKOUT, {"order": 1})
    run_until_idle(app)
    saga = app.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPLETED
    assert saga.outputs()["ship"] == {"step": "ship", "after": ["charge", "reserve"]}
    assert sagaapp.read_effects(backend_url) == [
        (saga_id, "reserve", "do"),
        (saga_id, "charge", "do"),
        (saga_id, "ship", "do"),
    ]


def test_a_rejected_step_is_compensated_in_reverse(app: sqlbroker.Broker, backend_url: str) -> None:
    saga_id = app.sagas.start(sagaapp.CHECKOUT, {"fail": "ship"})
    run_until_idle(app)
    saga = app.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPENSATED
    assert saga.error == "step ship failed: ship refused"
    assert [step.status for step in saga.steps] == [
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
        StepStatus.FAILED,
    ]
    assert sagaapp.read_effects(backend_url) == [
        (saga_id, "reserve", "do"),
        (saga_id, "charge", "do"),
        (saga_id, "charge", "undo"),
        (saga_id, "reserve", "undo"),
    ]
    assert app.dead_letters.list() == []


def test_a_failing_compensation_fails_the_saga_and_dead_letters_it(
    app: sqlbroker.Broker, backend_url: str
) -> None:
    saga_id = app.sagas.start(sagaapp.CHECKOUT, {"fail": "ship", "undo_fail": "charge"})
    run_until_idle(app)
    saga = app.sagas.get(saga_id)
    assert saga.status is SagaStatus.FAILED
    assert saga.error is not None
    assert saga.error.startswith("compensation of step charge failed")
    assert saga.steps[1].status is StepStatus.COMPENSATION_FAILED
    assert saga.steps[1].attempts == 3
    dead = app.dead_letters.list()
    assert [letter.message_id for letter in dead] == [saga.message_id]
    assert ("charge", "undo") not in {(s, k) for _, s, k in sagaapp.read_effects(backend_url)}


def test_cancel_compensates_what_is_done(app: sqlbroker.Broker, backend_url: str) -> None:
    saga_id = app.sagas.start(sagaapp.CHECKOUT, {})
    run_until_idle(app, subscriptions=["saga.checkout.reserve"])
    assert app.sagas.cancel(saga_id)
    run_until_idle(app)
    saga = app.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPENSATED
    assert [step.status for step in saga.steps] == [
        StepStatus.COMPENSATED,
        StepStatus.CANCELLED,
        StepStatus.PENDING,
    ]
    assert [kind for _, _, kind in sagaapp.read_effects(backend_url)] == ["do", "undo"]


PAYMENT = Saga("payment", [Step("reserve"), Step("charge")], timeout=600)


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # charge has no compensation
@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_an_output_that_is_not_a_valid_payload_fails_the_step(
    backend_url: str, transactional: bool
) -> None:
    """A NUL in an output is refused before SQL on both backends (jsonb would refuse it
    with a driver error): the step fails at once, without the retries its policy allows,
    since each would repeat the action only to return the same value."""
    calls: list[str] = []
    with sqlbroker.Broker(backend_url, migrate=True) as broker:

        @broker.saga_step(PAYMENT, "reserve")
        def reserve(ctx: StepContext) -> dict[str, str]:
            calls.append("reserve")
            return {"held": "yes"}

        @broker.saga_compensation(PAYMENT, "reserve")
        def release(ctx: StepContext) -> None:
            calls.append("release")

        fast = sqlbroker.RetryPolicy(base=0.01, cap=0.02, max_attempts=3)

        @broker.saga_step(PAYMENT, "charge", retry=fast, transactional=transactional)
        def charge(ctx: StepContext) -> dict[str, str]:
            calls.append("charge")
            return {"receipt": "a\x00b"}

        saga_id = broker.sagas.start(PAYMENT, {"amount": 3})
        run_until_idle(broker)
        saga = broker.sagas.get(saga_id)
        assert saga.status is SagaStatus.COMPENSATED, saga
        assert [step.status for step in saga.steps] == [StepStatus.COMPENSATED, StepStatus.FAILED]
        error = saga.steps[1].error
        assert error is not None
        assert "output: cannot be stored: the value['receipt'] contains a NUL" in error
        assert calls == ["reserve", "charge", "release"]
        assert broker.dead_letters.list() == []


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # no compensations: none run
def test_plain_steps_run_on_the_workers_handler_threads(backend_url: str) -> None:
    """Like any plain-function handler: a step's concurrency is what runs at once."""
    count = 10
    barrier = threading.Barrier(count, timeout=20)
    threads: list[str] = []
    with sqlbroker.Broker(backend_url, migrate=True) as broker:

        @broker.saga_step(PAYMENT, "reserve", concurrency=count)
        def reserve(ctx: StepContext) -> int:
            threads.append(threading.current_thread().name)
            barrier.wait()  # breaks (and the step fails) unless all run at once
            return ctx.attempt

        @broker.saga_step(PAYMENT, "charge")
        def charge(ctx: StepContext) -> None:
            threads.append(threading.current_thread().name)

        sagas = [broker.sagas.start(PAYMENT, {"n": n}) for n in range(count)]
        run_until_idle(broker)
        assert [broker.sagas.get(s).status for s in sagas] == [SagaStatus.COMPLETED] * count
        assert [broker.sagas.get(s).outputs()["reserve"] for s in sagas] == [1] * count
        assert len(threads) == 2 * count
        assert all(name.startswith("sqlbroker-handler") for name in threads), threads


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # no compensations
def test_coroutine_steps_keep_their_bookkeeping_off_the_default_executor(
    backend_url: str,
) -> None:
    """The saga's reads and transitions around a coroutine step run on the worker's handler
    threads: user code owns asyncio's default executor, here one that refuses all work."""
    count = 12
    with sqlbroker.Broker(backend_url, migrate=True) as broker:

        @broker.saga_step(PAYMENT, "reserve", concurrency=count)
        async def reserve(ctx: StepContext) -> int:
            await asyncio.sleep(0)
            return ctx.attempt

        @broker.saga_step(PAYMENT, "charge")
        async def charge(ctx: StepContext) -> str:
            return "charged"

        sagas = [broker.sagas.start(PAYMENT, {"n": n}) for n in range(count)]

        async def run() -> None:
            asyncio.get_running_loop().set_default_executor(RefusingExecutor())
            await broker.worker(install_signal_handlers=False).run_async(
                until_idle=True, timeout=60
            )

        asyncio.run(run())
        assert [broker.sagas.get(s).status for s in sagas] == [SagaStatus.COMPLETED] * count
        assert [broker.sagas.get(s).outputs() for s in sagas] == [
            {"reserve": 1, "charge": "charged"}
        ] * count


class _AsyncCallable:
    """An object whose ``__call__`` is a coroutine function: run like an ``async def``."""

    def __init__(self, value: str) -> None:
        self.value = value

    async def __call__(self, ctx: StepContext | sqlbroker.Message) -> str:
        await asyncio.sleep(0)
        return self.value


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # no compensations
def test_async_callable_objects_are_awaited_as_steps_and_handlers(backend_url: str) -> None:
    """A saga step or a subscriber that is an object with ``async def __call__`` is awaited
    (called as a plain function, it would hand back a coroutine never awaited)."""
    handled = _AsyncCallable("handled")
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.saga_step(PAYMENT, "reserve")(_AsyncCallable("reserved"))
        broker.saga_step(PAYMENT, "charge")(_AsyncCallable("charged"))
        broker.subscriber(queue="plain")(handled)
        saga_id = broker.sagas.start(PAYMENT, {"n": 1})
        (message_id,) = broker.send_many("plain", [1])
        run_until_idle(broker)
        assert broker.sagas.get(saga_id).outputs() == {"reserve": "reserved", "charge": "charged"}
        result = broker.result(message_id)
        assert result is not None
        assert result.value == "handled"


class _SagaWorker:
    def __init__(self, url: str, workdir: Path, number: int) -> None:
        self.ready = workdir / f"saga-worker-{number}.ready"
        self.log = workdir / f"saga-worker-{number}.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(TESTS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "SQLBROKER_URL": url,
            "SQLBROKER_READY": str(self.ready),
            "SQLBROKER_LEASE": "1.5",
            "SQLBROKER_REAP_INTERVAL": "0.3",
        }
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "runtime.sagaapp"],
                env=env,
                cwd=TESTS_DIR,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # the handlers start later
@pytest.mark.slow
def test_every_saga_ends_with_workers_killed_in_a_loop(backend_url: str, tmp_path: Path) -> None:
    sagaapp.create_table(backend_url)
    rng = random.Random(8)
    with sqlbroker.Broker(backend_url, migrate=True) as producer:
        plans: dict[str, dict[str, object]] = {}
        for number in range(40):
            data: dict[str, object] = {"sleep": 0.05}
            if number % 3 == 1:
                data["fail"] = rng.choice(["charge", "ship"])
            plans[producer.sagas.start(sagaapp.CHECKOUT, data, saga_id=f"s{number:02d}")] = data
        workers = [_SagaWorker(backend_url, tmp_path, n) for n in range(2)]
        spawned, kills = 2, 0

        def open_sagas() -> int:
            counts = producer.sagas.counts()
            return counts.get("running", 0) + counts.get("compensating", 0)

        try:
            deadline = time.monotonic() + 30
            while open_sagas() and time.monotonic() < deadline and kills < 12:
                time.sleep(rng.uniform(0.3, 0.9))
                victim = rng.randrange(len(workers))
                workers[victim].kill()
                kills += 1
                workers[victim] = _SagaWorker(backend_url, tmp_path, spawned)
                spawned += 1
            wait_until(lambda: open_sagas() == 0, timeout=60, what="every saga to end")
        finally:
            for worker in workers:
                worker.kill()
        assert kills >= 3
        retried = sum(step.attempts > 1 for sid in plans for step in producer.sagas.get(sid).steps)
        print(f"kills={kills} steps retried after a kill={retried}")
        effects = sagaapp.read_effects(backend_url)
        for saga_id, data in plans.items():
            saga = producer.sagas.get(saga_id)
            mine = [(step, kind) for sid, step, kind in effects if sid == saga_id]
            if "fail" not in data:
                assert saga.status is SagaStatus.COMPLETED, saga
                assert mine == [("reserve", "do"), ("charge", "do"), ("ship", "do")]
                continue
            assert saga.status is SagaStatus.COMPENSATED, (saga.error, saga.steps)
            done = ["reserve", "charge", "ship"][: ["charge", "ship"].index(data["fail"]) + 1]
            assert mine == [(s, "do") for s in done] + [(s, "undo") for s in reversed(done)]
        counts = collections.Counter(producer.sagas.counts())
        assert counts["completed"] + counts["compensated"] == len(plans)
