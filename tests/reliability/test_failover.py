"""Failover to a synchronous streaming standby under load (issue 25, part 1).

A durable primary and a synchronous standby (``pg_basebackup -R``,
``synchronous_standby_names = '*'``) of the test's own; producer and worker processes
connect with the libpq multi-host URL ``postgresql://u@h:p1,h:p2/db?target_session_attrs=
read-write``, so they find whichever server accepts writes. The primary's postmaster is
killed with SIGKILL (its host gone) and the standby promoted. Nothing acknowledged may be
lost (a commit returned only once the standby had flushed it), every duplicate must have a
reason, and work must resume within 5 s of the promotion with no process restarted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlbroker
from pgserver import PostgresServer
from reliability.checker import verdict_for
from reliability.history import HistoryWriter, read_histories
from reliability.pgfaults import (
    agents,
    completions,
    consumer,
    first_after,
    producer,
    wait_all,
    wait_drained,
)
from runtime.support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

RATE = 40.0
LEASE = 3.0
RESUMED_WITHIN = 5.0  # seconds from the promotion, the bar
DATABASE = "faults"


@pytest.fixture
def pair() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    primary = PostgresServer(durable=True)
    standby = PostgresServer(durable=True)
    try:
        primary.start()
        primary.create_database(DATABASE)
        with sqlbroker.Broker(primary.url(DATABASE)) as broker:
            broker.migrate()
        standby.start_standby(primary)
        # Synchronous only now: with no standby yet, every commit would wait for one.
        primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        primary.execute("SELECT pg_reload_conf()")
        wait_until(
            lambda: (
                primary.execute("SELECT string_agg(sync_state, ',') FROM pg_stat_replication")
                == "sync"
            ),
            timeout=30,
            what="a synchronous standby",
            interval=0.1,
        )
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()


def test_sigkill_of_the_primary_and_promotion_of_the_standby_lose_nothing(
    pair: tuple[PostgresServer, PostgresServer], tmp_path: Path
) -> None:
    primary, standby = pair
    url = (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        f"/{DATABASE}?target_session_attrs=read-write"
    )
    faults = HistoryWriter(tmp_path, "faults")
    stop_file = tmp_path / "stop"
    with agents() as started:
        workers = [
            consumer(url, tmp_path, f"consumer{index}", lease=LEASE, sleep=0.02)
            for index in range(2)
        ]
        started.extend(workers)
        for agent in workers:
            agent.wait_ready()
        producers = [
            producer(
                url,
                tmp_path,
                f"producer{index}",
                rate=RATE,
                stop_file=stop_file,
                batch=1 + 3 * index,
                tx_every=7,
            )
            for index in range(2)
        ]
        started.extend(producers)
        for agent in producers:
            agent.wait_ready()
        time.sleep(4)
        faults.fault("failover", "server")
        killed = time.monotonic()
        primary.kill_postmaster()
        time.sleep(1)  # the failover manager's detection time, say
        standby.promote()
        promoted = time.monotonic()
        faults.record("promoted", seconds=promoted - killed)
        time.sleep(6)
        stop_file.touch()
        wait_all(producers, timeout=60)
        wait_drained(url, timeout=60)
        for agent in workers:
            assert agent.alive, agent.log()
            assert agent.stop() == 0, agent.log()

    events = read_histories(tmp_path)
    verdict = verdict_for(events, url, subscriptions=["jobs"], lease=LEASE)
    completed = first_after(completions(events), promoted)
    published = first_after(
        sorted(e["mono"] for e in events if e["op"] == "publish" and e["status"] == "ok"),
        promoted,
    )
    statuses = Counter(e["status"] for e in events if e["op"] == "publish")
    assert completed is not None, "no completion after the promotion"
    assert published is not None, "no publish after the promotion"
    print(
        f"\nkill to promotion {promoted - killed:.2f} s; after the promotion: first completion"
        f" {completed - promoted:.2f} s, first publish {published - promoted:.2f} s;"
        f" publish attempts {dict(statuses)}\n{verdict.summary()}"
    )
    verdict.assert_clean()
    assert completed - promoted <= RESUMED_WITHIN
    assert published - promoted <= RESUMED_WITHIN
