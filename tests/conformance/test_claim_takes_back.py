"""A consumer loop of one's own (``broker.claim`` → ``complete``) with no worker anywhere:
when a consumer dies holding a lease, another consumer's claim gets the message once the
lease has run out — the claim takes back expired leases itself, as SQS does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import sqlbroker

_CONSUMER = """
import sys, time
import sqlbroker
broker = sqlbroker.Broker(sys.argv[1])
(delivery,) = broker.claim("jobs", lease=30)
print(delivery.message_id, flush=True)
time.sleep(600)  # killed here, holding the lease
"""


def _consumer_killed_holding_a_lease(backend_url: str, src: Path) -> str:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen(
        [sys.executable, "-c", _CONSUMER, backend_url],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        claimed = process.stdout.readline().strip()
        assert claimed, "the consumer claimed nothing"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert process.returncode == -signal.SIGKILL
    return claimed


def _src() -> Path:
    return Path(sqlbroker.__file__).resolve().parent.parent


def test_a_dead_consumers_message_comes_back_to_a_plain_claim_loop(
    backend_url: str, clock: sqlbroker.ManualClock
) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as setup:
        message_id = setup.send("jobs", {"n": 1}, max_attempts=3)
    with sqlbroker.Broker(backend_url, clock=clock) as broker:
        assert _consumer_killed_holding_a_lease(backend_url, _src()) == message_id
        assert broker.claim("jobs") == [], "the lease still runs"
        clock.advance(timedelta(seconds=120))  # well past the lease, begun after the clock
        (delivery,) = broker.claim("jobs")  # no worker, no reap(): the claim takes it back
        assert delivery.message_id == message_id
        assert delivery.attempt == 2
        broker.complete(delivery)
        assert broker.pending("jobs") == []


def test_a_dead_consumers_last_attempt_is_dead_lettered_by_the_claim(
    backend_url: str, clock: sqlbroker.ManualClock
) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as setup:
        message_id = setup.send("jobs", {"n": 1}, max_attempts=1)
    with sqlbroker.Broker(backend_url, clock=clock) as broker:
        assert _consumer_killed_holding_a_lease(backend_url, _src()) == message_id
        clock.advance(timedelta(seconds=120))  # well past the lease, begun after the clock
        assert broker.claim("jobs") == []
        (dead,) = broker.dead_letters.list()
        assert (dead.message_id, dead.error_type) == (message_id, "sqlbroker.WorkerLost")
