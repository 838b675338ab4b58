"""Clock skew between hosts: producers and workers whose wall clocks run 5 minutes ahead
and 5 minutes behind (libfaketime, ``FAKETIME=±5m``, monotonic time left real).

PostgreSQL: leases, delays and TTLs are computed by the server's clock, so the skew makes
no difference. Every claim's time is read back from the history (the lease's end as the
claim set it, minus the lease), so each assertion is on the database's clock:

- no early redelivery: a copy is claimed again only after its previous lease ended;
- no early delivery: nothing is claimed before its ``available_at``, and messages delayed
  by two minutes are not claimed at all; the delays were added to the server's time, not
  the producer's (``enqueued_at`` is the real time of the test);
- TTLs: nothing is claimed at or after its ``expires_at``; messages with a 1.5 s TTL that
  nobody consumes are expired, not before ``enqueued_at`` + 1.5 s; two-minute TTLs are not.

SQLite has no server: its "database clock" is the clock of the process running each
statement. One file is only ever shared by the processes of one host, which share one
clock, so skew between hosts cannot arise; a process with a faked clock is the one way to
get it, and then that process judges leases, delays and TTLs by its own clock. The SQLite
test pins that documented limit rather than a guarantee.

Sizes (``SQLBROKER_FAULTS_SCALE`` = 1), PostgreSQL: 4 workers (2 ahead, 2 behind) of 4
handlers, lease 1 s; 600 messages of 80 ms and 12 of 2 s (past the lease, so their
leases are extended under skew) with 2-minute TTLs, 100 delayed by 1.5 s, 20 by 2
minutes, 50 with a 1.5 s TTL and 20 with a 2-minute TTL on an unconsumed queue; a worker
running a handler SIGKILLed (and replaced with the same skew) every 0.5–0.9 s, 6 times,
from the moment the producers start: at least 3 fall inside the 3 s the plain messages
take on 16 handlers, however fast the machine. (The loop once started only after the
producers ended, and CI's one kill came after the drain: no redelivery to see.)
"""

from __future__ import annotations

import collections
import itertools
import json
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from reliability.history import Event
from reliability.processes import Fleet, faketime_library, scaled, scaled_seconds, wait_finished
from runtime.support import ModuleProcess

LEASE = 1.0
AHEAD, BEHIND = "+5m", "-5m"
# Timestamps cross a float JSON round trip and the drivers' microseconds.
EPSILON = 0.002
WORKER = {
    "queues": "jobs,later",
    "concurrency": 4,
    "lease": LEASE,
    "reap_interval": 0.2,
    "poll_interval": 0.2,
    "max_attempts": 1000,
}


def producers(fleet: Fleet) -> dict[str, ModuleProcess]:
    """What each skewed producer publishes; see the module's docstring for the sizes."""
    two_minutes = '{"ttl": 120}'
    plan: list[tuple[str, str, dict[str, Any]]] = [
        ("plain", AHEAD, {"count": scaled(600), "payload": '{"sleep": 0.08}'}),
        ("long", BEHIND, {"count": scaled(12), "payload": '{"sleep": 2.0}'}),
        ("delayed", BEHIND, {"count": scaled(100), "options": '{"delay": 1.5}'}),
        ("later", AHEAD, {"count": scaled(20), "queue": "later", "options": '{"delay": 120}'}),
        ("ttl-short", AHEAD, {"count": scaled(50), "queue": "ttl", "options": '{"ttl": 1.5}'}),
        ("ttl-long", BEHIND, {"count": scaled(20), "queue": "ttl", "options": two_minutes}),
    ]
    started = {}
    for name, skew, options in plan:
        if options.get("queue") is None and name != "delayed":
            options["options"] = two_minutes
        started[name] = fleet.producer(name, faketime=skew, batch=100, **options)
    return started


def claimed_at(delivery: Event) -> float:
    """The database's time of the claim: the lease's end as the claim set it, less the
    lease."""
    return float(delivery["leased_until"]) - LEASE


def pg_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as pg:
        return [tuple(row) for row in pg.execute(sql).fetchall()]


@pytest.mark.slow
@pytest.mark.postgres
def test_skewed_hosts_follow_the_database_clock(pg_url: str, tmp_path: Path) -> None:
    faketime_library()
    url = pg_url
    started_wall = datetime.now(UTC).timestamp()
    rng = random.Random(5)
    with Fleet(url, tmp_path) as fleet:
        skews = [AHEAD, AHEAD, BEHIND, BEHIND]
        workers = [fleet.worker(faketime=skew, **WORKER) for skew in skews]
        consumed = scaled(600) + scaled(12) + scaled(100)  # the copies the workers finish
        kills = 0
        next_kill = time.monotonic() + 0.5

        def kill_some() -> None:
            nonlocal kills, next_kill
            if time.monotonic() < next_kill or kills >= scaled(6):
                return
            ready = [
                n
                for n, worker in enumerate(workers)
                if worker.ready_path.exists() and fleet.at_work(worker)
            ]
            if not ready:
                return
            next_kill = time.monotonic() + rng.uniform(0.5, 0.9)
            index = rng.choice(ready)
            fleet.inject(workers[index], "kill")
            workers[index] = fleet.worker(faketime=skews[index], **WORKER)
            kills += 1

        publishing = producers(fleet)
        deadline = time.monotonic() + scaled_seconds(120)
        while any(producer.alive for producer in publishing.values()):
            assert time.monotonic() < deadline, "the producers did not finish"
            kill_some()
            time.sleep(0.05)
        for producer in publishing.values():
            assert producer.wait(timeout=30) == 0, producer.log()
        wait_finished(url, ["jobs"], consumed, timeout=300, while_waiting=kill_some)
        # The short TTLs are long past: the reapers (every 0.2 s) expired them by now, or
        # do within a few passes.
        wait_finished(url, ["ttl"], scaled(50), timeout=30)
        statuses = fleet.stop_all()
        assert set(statuses.values()) == {0}, fleet.logs()
        events = fleet.events()
    finished_wall = datetime.now(UTC).timestamp()

    deliveries = [e for e in events if e["op"] == "deliver"]
    assert deliveries
    tag_subs = {e["tag"]: e["subs"][0] for e in events if e["op"] == "publish"}
    assert not [e for e in deliveries if e["sub"] != "jobs"], "a 2-minute delay was not kept"
    for delivery in deliveries:
        claim = claimed_at(delivery)
        assert claim >= delivery["available_at"] - EPSILON, delivery
        if delivery["expires_at"] is not None:
            assert claim < delivery["expires_at"], delivery
        # The server stamped the message with the real time, not a producer's skewed one.
        assert started_wall - 1 <= delivery["enqueued_at"] <= finished_wall + 1, delivery
        if delivery["tag"].startswith("delayed"):
            assert delivery["available_at"] - delivery["enqueued_at"] == pytest.approx(
                1.5, abs=EPSILON
            )

    # No early redelivery: each claim of a copy starts after the previous lease ended.
    by_copy: dict[str, list[Event]] = collections.defaultdict(list)
    for delivery in deliveries:
        by_copy[delivery["id"]].append(delivery)
    redeliveries = 0
    for trail in by_copy.values():
        trail.sort(key=lambda e: e["attempt"])
        for earlier, later in itertools.pairwise(trail):
            redeliveries += 1
            assert claimed_at(later) >= earlier["leased_until"] - EPSILON, (earlier, later)
    assert kills >= 3
    assert redeliveries > 0

    # TTLs on the unconsumed queue: the short ones expired by the server's clock, the long
    # ones not at all; the 2-minute delays still wait.
    expired = pg_rows(
        url,
        "SELECT payload, extract(epoch FROM enqueued_at), extract(epoch FROM finished_at)"
        " FROM sqlbroker_archive WHERE subscription = 'ttl' AND outcome = 'expired'",
    )
    assert len(expired) == scaled(50)
    for payload, enqueued, finished in expired:
        assert json.loads(bytes(payload))["tag"].startswith("ttl-short")
        assert float(finished) >= float(enqueued) + 1.5 - EPSILON
    waiting = pg_rows(
        url,
        "SELECT message_id, subscription, state FROM sqlbroker_message ORDER BY subscription",
    )
    assert collections.Counter((sub, state) for _, sub, state in waiting) == {
        ("later", "scheduled"): scaled(20),
        ("ttl", "available"): scaled(20),
    }
    # Ended by hand so that every copy is accounted for in the verdict.
    with sqlbroker.Broker(url) as broker:
        for message_id, _, _ in waiting:
            assert broker.cancel(str(message_id)) == 1
    verdict = fleet.verdict(["jobs"], events=events, lease=LEASE)
    print(f"{kills} kills, {redeliveries} redeliveries;", verdict.summary())
    verdict.assert_clean()
    assert verdict.published == len(tag_subs)


@pytest.mark.slow
def test_sqlite_judges_time_by_each_process_clock(tmp_path: Path) -> None:
    """The documented limit: on SQLite a process whose clock runs ahead sees a delayed
    message as due, because the statement's time is that process's time."""
    faketime_library()
    url = f"sqlite:///{tmp_path}/test.db"
    with sqlbroker.Broker(url) as broker, Fleet(url, tmp_path) as fleet:
        broker.send("jobs", {"tag": "delayed", "sleep": 0}, delay=120)
        worker = fleet.worker(faketime=AHEAD, mode="until-idle", timeout=60)
        assert worker.wait(timeout=90) == 0, worker.log()
        assert [row.outcome for row in broker.archive("jobs")] == [sqlbroker.Outcome.COMPLETED]
        (delivery,) = [e for e in fleet.events() if e["op"] == "deliver"]
        assert delivery["available_at"] - delivery["enqueued_at"] == pytest.approx(120, abs=1)
