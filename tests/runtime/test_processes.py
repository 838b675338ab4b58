"""Real worker processes, killed with real signals: nothing is lost, a message that kills
its worker is quarantined, SIGTERM drains, a second signal stops at once, and several
processes share one database's work.

Every worker here is ``python -m runtime.workerapp`` (see workerapp.py); its handler's
behaviour comes from each message's payload and it records ``start``/``finish`` events to
the test's effects file.
"""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import sqlbroker
from runtime.support import (
    WorkerProcess,
    assert_all_completed_once,
    count_by_id,
    events,
    wait_until,
)

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]


def test_a_killed_worker_s_message_is_delivered_again_and_nothing_is_lost(
    broker: sqlbroker.Broker, spawn_worker: Spawn, effects: Path
) -> None:
    ids = {
        broker.send("jobs", {"id": name, "sleep": 0.05, **extra}): name
        for name, extra in [
            ("stuck", {"hang_attempts": 1, "hang": 60}),
            *((f"m{index}", {}) for index in range(11)),
        ]
    }
    # The stuck message is the oldest, so the first claim takes it.
    first = spawn_worker(lease=1.5, concurrency=2, prefetch=2)
    wait_until(
        lambda: events(effects, "start", ["stuck"]), timeout=20, what="the stuck handler to start"
    )
    first.send(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    finished_before = count_by_id(effects, "finish")
    assert finished_before["stuck"] == 0

    second = spawn_worker(lease=1.5, concurrency=2, reap_interval=0.2, mode="until-idle")
    assert second.wait(timeout=30) == 0, second.log()

    archived = assert_all_completed_once(broker, "jobs", ids)
    by_name = {ids[message_id]: row for message_id, row in archived.items()}
    assert by_name["stuck"].attempts >= 2
    stuck_starts = events(effects, "start", ["stuck"])
    assert [e["pid"] for e in stuck_starts] == [first.pid, second.pid]
    assert [e["attempt"] for e in stuck_starts] == [1, 2]
    # Every message's handler ran to its end, at most once in each process: a message the
    # killed worker finished but had not yet acknowledged is a stated duplicate.
    finishes = events(effects, "finish")
    assert {e["id"] for e in finishes} == set(ids.values())
    per_process = collections.Counter((e["id"], e["pid"]) for e in finishes)
    assert all(count == 1 for count in per_process.values()), per_process


@pytest.mark.parametrize("limit_from", ["message", "policy"])
def test_a_message_that_kills_its_worker_is_dead_lettered_after_max_attempts(
    broker: sqlbroker.Broker, spawn_worker: Spawn, effects: Path, limit_from: str
) -> None:
    """Attempts are counted at claim time, so a message that kills every worker that takes
    it is quarantined once its attempts are spent: three, set on the message or by the
    subscriber's retry policy (the messages' own limit is then the default five)."""
    if limit_from == "message":
        poison = broker.send("jobs", {"id": "poison", "exit_attempts": 1000}, max_attempts=3)
        # Another message may be running next to the poison when it kills the worker.
        options = {"concurrency": 2, "prefetch": 0}
    else:
        poison = broker.send("jobs", {"id": "poison", "exit_attempts": 1000})
        # One at a time: an innocent message next to the poison would lose attempts too.
        options = {"concurrency": 1, "prefetch": 0, "max_attempts": 3}
    others = [broker.send("jobs", {"id": f"m{index}", "sleep": 0.2}) for index in range(8)]

    crashes = 0
    worker = spawn_worker(lease=1.0, reap_interval=0.2, **options)
    deadline = time.monotonic() + 60

    def settled() -> bool:
        dead = broker.dead_letters.list(subscription="jobs")
        done = len(broker.archive("jobs", limit=100))
        return len(dead) == 1 and done == len(others) and not broker.pending("jobs")

    # The supervisor: restart the worker whenever it dies, as systemd would.
    while not settled():
        assert time.monotonic() < deadline, f"not settled after {crashes} crashes"
        if not worker.alive:
            # Only the poison may take a worker down: a worker that exited for another
            # reason (failing to start, say) would not be one of its attempts.
            assert worker.process.returncode == 1, worker.log()
            poison_pids = {e["pid"] for e in events(effects, "start", ["poison"])}
            assert worker.pid in poison_pids, worker.log()
            crashes += 1
            worker = spawn_worker(lease=1.0, reap_interval=0.2, **options)
        time.sleep(0.05)
    worker.send(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0, worker.log()

    assert crashes == 3, events(effects, "start", ["poison"])
    (dead,) = broker.dead_letters.list(subscription="jobs")
    assert dead.message_id == poison
    assert dead.attempts == 3
    assert "worker lost" in dead.reason
    assert len(events(effects, "start", ["poison"])) == 3
    archived = broker.archive("jobs", limit=100)
    assert sorted(row.message_id for row in archived) == sorted(others)
    assert all(row.outcome == sqlbroker.Outcome.COMPLETED for row in archived)


@pytest.mark.parametrize("handler", ["async", "sync"])
def test_sigterm_drains_running_handlers_and_releases_unstarted_claims(
    broker: sqlbroker.Broker, spawn_worker: Spawn, effects: Path, handler: str
) -> None:
    ids = broker.send_many("jobs", [{"id": f"m{index}", "sleep": 0.5} for index in range(16)])
    worker = spawn_worker(handler=handler, concurrency=3, prefetch=3, grace=15, lease=30)
    wait_until(
        lambda: len(events(effects, "start")) >= 3, timeout=20, what="three handlers to start"
    )
    worker.send(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(timeout=20) == 0, worker.log()
    assert time.monotonic() - started < 15

    starts, finishes = count_by_id(effects, "start"), count_by_id(effects, "finish")
    assert starts, "no handler started"
    assert starts == finishes, "a handler that started did not finish"
    assert len(archive := broker.archive("jobs", limit=100)) == sum(finishes.values())
    assert all(row.outcome == sqlbroker.Outcome.COMPLETED for row in archive)
    pending = broker.pending("jobs", limit=100)
    assert len(pending) == len(ids) - len(archive)
    assert [p for p in pending if p.state == sqlbroker.State.RUNNING] == []
    assert all(p.state == sqlbroker.State.AVAILABLE and p.attempts == 0 for p in pending), pending
    assert "claimed but unstarted" in worker.log()

    rest = spawn_worker(handler=handler, concurrency=3, mode="until-idle")
    assert rest.wait(timeout=30) == 0, rest.log()
    archived = assert_all_completed_once(broker, "jobs", ids)
    assert all(row.attempts == 1 for row in archived.values())
    assert all(count == 1 for count in count_by_id(effects, "start").values())


@pytest.mark.parametrize("handler", ["async", "sync"])
@pytest.mark.parametrize("signals", [("SIGTERM", "SIGTERM"), ("SIGINT", "SIGINT")])
def test_a_second_signal_stops_at_once_and_hands_the_message_back(
    broker: sqlbroker.Broker,
    spawn_worker: Spawn,
    effects: Path,
    handler: str,
    signals: tuple[str, str],
) -> None:
    go = effects.parent / "go"
    message_id = broker.send("jobs", {"id": "long", "hang_until": str(go), "hang": 30})
    worker = spawn_worker(handler=handler, grace=60, lease=30)
    wait_until(lambda: events(effects, "start"), timeout=20, what="the handler to start")
    worker.send(signal.Signals[signals[0]])
    time.sleep(0.3)
    assert worker.alive, "the first signal must wait for the running handler"
    worker.send(signal.Signals[signals[1]])
    started = time.monotonic()
    assert worker.wait(timeout=20) == 0, worker.log()
    assert time.monotonic() - started < 5, worker.log()
    assert events(effects, "finish") == []

    (pending,) = broker.pending("jobs")
    assert pending.message_id == message_id
    assert pending.state == sqlbroker.State.AVAILABLE
    assert pending.attempts == 0, "a stop is not a failure: the attempt is given back"
    assert "WorkerStopped" in (pending.last_error or "")

    go.touch()
    again = spawn_worker(handler=handler, mode="until-idle")
    assert again.wait(timeout=30) == 0, again.log()
    (archived,) = assert_all_completed_once(broker, "jobs", [message_id]).values()
    assert archived.attempts == 1
    assert [e["attempt"] for e in events(effects, "finish")] == [1]


@pytest.mark.parametrize("handler", ["async", "sync"])
def test_handlers_still_running_when_the_grace_period_ends_are_cancelled(
    broker: sqlbroker.Broker, spawn_worker: Spawn, effects: Path, handler: str
) -> None:
    stuck = broker.send("jobs", {"id": "stuck", "hang_attempts": 1, "hang": 30})
    worker = spawn_worker(handler=handler, grace=1.0, lease=30)
    wait_until(lambda: events(effects, "start"), timeout=20, what="the handler to start")
    worker.send(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(timeout=20) == 0, worker.log()
    assert time.monotonic() - started < 8, worker.log()
    assert "cancelling 1 running handler" in worker.log()

    (pending,) = broker.pending("jobs")
    assert pending.message_id == stuck
    assert pending.state == sqlbroker.State.AVAILABLE
    assert pending.attempts == 0, "a stop is not a failure: the attempt is given back"


def test_worker_processes_on_one_database_share_the_work(
    broker: sqlbroker.Broker, spawn_worker: Spawn, effects: Path
) -> None:
    workers = [spawn_worker(concurrency=2, handler="sync") for _ in range(3)]
    for worker in workers:
        worker.wait_ready()
    ids = broker.send_many("jobs", [{"id": f"m{index}", "sleep": 0.1} for index in range(60)])
    wait_until(
        lambda: len(events(effects, "finish")) >= len(ids),
        timeout=60,
        what="every message to be handled",
    )
    for worker in workers:
        worker.send(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=20) == 0, worker.log()

    archived = assert_all_completed_once(broker, "jobs", ids)
    assert all(row.attempts == 1 for row in archived.values())
    assert all(count == 1 for count in count_by_id(effects, "start").values())
    per_worker = collections.Counter(e["pid"] for e in events(effects, "finish"))
    assert set(per_worker) == {worker.pid for worker in workers}, per_worker
