"""PostgreSQL: the worker's connections are terminated by the server while it runs. The
LISTEN connection comes back, and whatever happens to it, the bounded poll keeps every
message's latency within the poll interval; a lost pooled connection loses nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

import sqlbroker
from pgserver import quote_literal
from runtime.support import assert_all_completed_once, wait_until

pytestmark = pytest.mark.postgres

WORKER_APP = "sqlbroker-worker-under-test"
POLL_INTERVAL = 1.0
MARGIN = 1.0


@dataclass
class RunningWorker:
    broker: sqlbroker.Broker
    dbname: str
    server: Any
    handled: dict[Any, float] = field(default_factory=dict)

    def backend_pids(self, *, listening: bool) -> set[int]:
        query = (
            "select pid from pg_stat_activity"
            f" where datname = {quote_literal(self.dbname)}"
            f" and application_name = {quote_literal(WORKER_APP)}"
        )
        if listening:
            query += " and query ilike 'LISTEN%'"
        return {int(line) for line in self.server.execute(query).split() if line.strip()}

    def terminate(self, *, listening: bool) -> set[int]:
        pids = self.backend_pids(listening=listening)
        assert pids, "the worker has no connection to terminate"
        self.server.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity"
            f" where pid in ({', '.join(map(str, pids))})"
        )
        return pids


@pytest.fixture
def running_worker(pg_url: str, pg_server: Any) -> Iterator[RunningWorker]:
    """A worker (``run`` in a thread) on its own connections, named for pg_stat_activity;
    its handler records when each payload was handled (payload ``{"sleep": s}`` sleeps)."""
    broker = sqlbroker.Broker(pg_url, application_name=WORKER_APP)
    worker = RunningWorker(broker, unquote(urlsplit(pg_url).path.lstrip("/")), pg_server.server)

    @broker.subscriber(queue="jobs", concurrency=2)
    def handle(msg: sqlbroker.Message) -> None:
        if isinstance(msg.payload, dict):
            time.sleep(msg.payload.get("sleep", 0))
            worker.handled[msg.payload["id"]] = time.monotonic()
        else:
            worker.handled[msg.payload] = time.monotonic()

    runner = threading.Thread(
        target=broker.run,
        kwargs={"install_signal_handlers": False, "poll_interval": POLL_INTERVAL},
        daemon=True,
    )
    runner.start()
    try:
        wait_until(
            lambda: worker.backend_pids(listening=True), timeout=20, what="the worker to LISTEN"
        )
        yield worker
    finally:
        broker.stop()
        runner.join(timeout=30)
        broker.close()
    assert not runner.is_alive(), "the worker did not stop"


def publish_and_time(publisher: sqlbroker.Broker, worker: RunningWorker, count: int) -> list[float]:
    """Send ``count`` messages one by one, each after the worker went idle; return each
    one's publish-to-handled latency."""
    latencies = []
    for index in range(count):
        time.sleep(1.3 * POLL_INTERVAL)
        sent = time.monotonic()
        publisher.send("jobs", f"after-{index}")
        wait_until(
            lambda i=index: f"after-{i}" in worker.handled, timeout=20, what=f"message {index}"
        )
        latencies.append(worker.handled[f"after-{index}"] - sent)
    return latencies


def test_the_listen_connection_comes_back_after_the_server_terminates_it(
    running_worker: RunningWorker, pg_url: str
) -> None:
    old = running_worker.terminate(listening=True)
    new = wait_until(
        lambda: running_worker.backend_pids(listening=True) - old,
        timeout=15,
        what="the worker to LISTEN again",
    )
    assert new.isdisjoint(old)
    with sqlbroker.Broker(pg_url) as publisher:
        latencies = publish_and_time(publisher, running_worker, 3)
        assert max(latencies) <= POLL_INTERVAL + MARGIN, latencies
        # The ack is written back in a batch shortly after the handler returns.
        wait_until(lambda: len(publisher.archive("jobs")) == 3, timeout=10, what="the acks")


def test_messages_are_handled_within_the_poll_bound_after_every_connection_is_terminated(
    running_worker: RunningWorker, pg_url: str
) -> None:
    with sqlbroker.Broker(pg_url) as publisher:
        # Give the worker's pool a few connections to lose.
        ids = publisher.send_many("jobs", [{"id": f"warm-{n}", "sleep": 0.1} for n in range(6)])
        wait_until(lambda: len(publisher.archive("jobs")) == 6, timeout=20, what="warm-up")
        running_worker.terminate(listening=False)
        latencies = publish_and_time(publisher, running_worker, 3)
        assert max(latencies) <= POLL_INTERVAL + MARGIN, latencies
        wait_until(lambda: len(publisher.archive("jobs")) == 9, timeout=10, what="the acks")
        assert publisher.dead_letters.list() == []
        assert {row.message_id for row in publisher.archive("jobs")} >= set(ids)


def test_a_connection_lost_while_handlers_run_loses_nothing(
    running_worker: RunningWorker, pg_url: str
) -> None:
    with sqlbroker.Broker(pg_url) as publisher:
        ids = publisher.send_many("jobs", [{"id": f"m{n}", "sleep": 0.8} for n in range(4)])
        wait_until(
            lambda: any(p.state == sqlbroker.State.RUNNING for p in publisher.pending("jobs")),
            timeout=20,
            what="a handler to start",
        )
        running_worker.terminate(listening=False)
        wait_until(
            lambda: len(publisher.archive("jobs")) == len(ids),
            timeout=30,
            what="every message to complete",
        )
        archived = assert_all_completed_once(publisher, "jobs", ids)
        assert all(row.attempts == 1 for row in archived.values())
