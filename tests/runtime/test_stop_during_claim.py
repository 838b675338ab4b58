"""PostgreSQL: the stop comes while the worker's claim waits on the server. What that claim
takes must go back at once, its attempt uncounted, not sit leased until the lease ends."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import sqlbroker
from runtime.support import wait_until

pytestmark = pytest.mark.postgres


def test_a_claim_that_lands_after_the_stop_is_released(pg_url: str) -> None:
    handled: list[object] = []
    with sqlbroker.Broker(pg_url, lease=600) as broker:
        message_id = broker.send("jobs", "late")

        @broker.subscriber(queue="jobs")
        def handle(msg: sqlbroker.Message) -> None:
            handled.append(msg.payload)

        # Another session locks the hot table: the worker's claim (an UPDATE) waits on it.
        with (
            psycopg.connect(pg_url) as blocker,
            psycopg.connect(pg_url, autocommit=True) as watcher,
        ):
            blocker.execute("LOCK TABLE sqlbroker_message IN EXCLUSIVE MODE")
            runner = threading.Thread(
                target=broker.run, kwargs={"install_signal_handlers": False}, daemon=True
            )
            runner.start()
            wait_until(
                lambda: (
                    watcher.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query ILIKE '%%sqlbroker_message%%'"
                    ).fetchone()
                    >= (1,)
                ),
                timeout=20,
                what="the worker's claim to wait on the lock",
            )
            broker.stop()
            time.sleep(0.5)  # the shutdown has released its (empty) buffer meanwhile
            blocker.commit()
        runner.join(timeout=30)
        assert not runner.is_alive(), "the worker did not stop"

        assert handled == []
        (pending,) = broker.pending("jobs")
        assert pending.message_id == message_id
        assert pending.state == sqlbroker.State.AVAILABLE
        assert pending.attempts == 0
