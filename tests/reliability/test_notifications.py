"""Lost notifications (issue 7): wake-ups are hints, the bounded poll guarantees progress.

Workers run with no listener at all (``listen=False``; on SQLite that is the commit
watcher, the polling part of the scenario), or on PostgreSQL with their LISTEN session
terminated every second or two; producers publish at a steady rate, some inside their own
transactions that commit and some inside transactions that roll back (their NOTIFY is
never sent and their messages must not exist). Nothing may be missed, and every message's
pickup (publish committed → handler started) must stay within the poll bound.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import sqlbroker
from reliability.checker import final_rows, verdict_for
from reliability.history import HistoryWriter, read_histories
from reliability.pgfaults import (
    Agent,
    agents,
    consumer,
    describe,
    listening_backends,
    pickup_latencies,
    producer,
    terminate_backends,
    wait_all,
    wait_drained,
)
from reliability.processes import scaled_seconds
from runtime.support import wait_until

RATE = 20.0  # messages per second, on average
BURST = 20  # published back to back once a second: workers go quiet, their polls slow down
APP = "notify-"


def run_scenario(
    url: str,
    workdir: Path,
    *,
    poll: float,
    listen: bool,
    seconds: float,
    terminate_every: float | None = None,
) -> tuple[list[dict[str, object]], list[int]]:
    """Two workers and one producer for ``seconds``; with ``terminate_every`` the workers'
    LISTEN sessions are terminated that often. Returns the histories and the number of
    sessions each termination hit."""
    faults = HistoryWriter(workdir, "faults")
    stop_file = workdir / "stop"
    terminated: list[int] = []
    with agents() as started:
        workers: list[Agent] = [
            consumer(
                url,
                workdir,
                f"consumer{index}",
                poll_interval=poll,
                listen=int(listen),
                application_name=f"{APP}consumer",
            )
            for index in range(2)
        ]
        started.extend(workers)
        for worker in workers:
            worker.wait_ready()
        publisher = producer(
            url,
            workdir,
            "producer",
            rate=RATE,
            burst=BURST,
            stop_file=stop_file,
            application_name=f"{APP}producer",
            tx_every=4,
            rollback_every=5,
        )
        started.append(publisher)
        publisher.wait_ready()
        if not url.startswith("sqlite"):
            listeners = listening_backends(url)
            assert listeners == (2 if listen else 0), f"{listeners} LISTEN sessions"
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            if terminate_every is None:
                time.sleep(max(0.0, ends - time.monotonic()))
                continue
            time.sleep(terminate_every)
            faults.fault("terminate_listener", "server")
            terminated.append(terminate_backends(url, application_prefix=APP, only_listeners=True))
        stop_file.touch()
        wait_all([publisher], timeout=60)
        wait_drained(url, timeout=30 + 4 * poll)
        for worker in workers:
            assert worker.alive, worker.log()
            assert worker.stop() == 0, worker.log()
    return read_histories(workdir), terminated


def judge(url: str, events: list[dict[str, object]], *, poll: float, slack: float) -> str:
    verdict = verdict_for(events, url, subscriptions=["jobs"])
    rolled_back = {
        str(e["tag"])
        for e in events
        if e["op"] == "publish" and e.get("error") == "rolled back on purpose"
    }
    present = {row.tag for row in final_rows(url)}
    latencies = pickup_latencies(events)
    report = (
        f"{verdict.summary()}\nrolled back={len(rolled_back)} pickup {describe(latencies.values())}"
    )
    print(f"\n{report}")
    verdict.assert_clean()
    assert rolled_back, "the scenario rolled nothing back"
    assert not rolled_back & present, f"rolled-back messages exist: {rolled_back & present}"
    assert len(latencies) == verdict.published
    slow = {tag: round(seconds, 3) for tag, seconds in latencies.items() if seconds > slack * poll}
    assert not slow, f"picked up later than {slack:g} poll intervals: {slow}"
    return report


@pytest.mark.slow
def test_without_a_listener_the_poll_finds_everything(backend_url: str, tmp_path: Path) -> None:
    poll = 0.5
    events, _ = run_scenario(
        backend_url, tmp_path, poll=poll, listen=False, seconds=scaled_seconds(6.0)
    )
    # The poll alone finds a message within one interval (the pump waits at most `poll`
    # between claims); the rest is slack for a loaded two-core machine, where a process
    # can be descheduled for hundreds of milliseconds: three intervals in all.
    judge(backend_url, events, poll=poll, slack=3)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_listener_terminated_every_few_seconds_misses_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    poll = 2.0
    events, terminated = run_scenario(
        pg_url, tmp_path, poll=poll, listen=True, seconds=scaled_seconds(8.0), terminate_every=1.5
    )
    assert sum(terminated) >= len(terminated), f"terminations hit {terminated} sessions"
    # A long poll interval, so a hint lost while the listener reconnects would show: yet
    # the listener polls once after every reconnect, and the poll bounds the rest. One
    # interval, plus half of one as slack for the loaded machine.
    report = judge(pg_url, events, poll=poll, slack=1.5)
    print(f"terminations={terminated}")
    assert report


def test_listen_false_opens_no_listener(backend_url: str) -> None:
    """``listen=False``: no listener thread (nor LISTEN session); another broker's message
    is found by the poll."""
    handled = threading.Event()

    def listeners() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "sqlbroker-listen"}

    earlier = listeners()  # an earlier test's, still on its way out
    with sqlbroker.Broker(backend_url, migrate=True) as worker_broker:

        @worker_broker.subscriber(queue="jobs")
        def handle(msg: sqlbroker.Message) -> None:
            handled.set()

        runner = threading.Thread(
            target=worker_broker.run,
            kwargs={"install_signal_handlers": False, "poll_interval": 0.2, "listen": False},
        )
        runner.start()
        try:
            with sqlbroker.Broker(backend_url, migrate=True) as other:
                other.send("jobs", {"tag": "a"})
            wait_until(handled.is_set, timeout=30, what="the message to be handled")
            assert not listeners() - earlier
            if not backend_url.startswith("sqlite"):
                assert listening_backends(backend_url) == 0
        finally:
            worker_broker.stop()
            runner.join(timeout=30)
