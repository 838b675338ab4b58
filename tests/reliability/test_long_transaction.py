"""A short soak with a long-running transaction held open (issue 7).

A producer publishes at a steady rate and a worker drains; after a baseline the test opens
a transaction that pins old row versions and holds it while the soak goes on, then ends it
and lets the soak run a little longer. Nothing may be lost (the checker's verdict), claim
latency must stay bounded against the same run's baseline, and what the transaction pinned
must be reclaimed after it ends:

- PostgreSQL: a REPEATABLE READ transaction that took a snapshot and holds an xid. While it
  is open VACUUM cannot remove the dead versions of the message table; once it ends, a
  VACUUM (run by the test: autovacuum's one-minute naptime is longer than the scenario)
  brings ``pg_stat_user_tables.n_dead_tup`` back down.
- SQLite: a read transaction pins the WAL. While it is open the checkpoints cannot get past
  its snapshot, so the WAL grows; once it ends the next automatic checkpoint backfills
  everything and the WAL restarts from its beginning (frames in use drop back).
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sqlbroker
from reliability.checker import verdict_for
from reliability.history import HistoryWriter, read_histories
from reliability.pgfaults import (
    agents,
    consumer,
    describe,
    producer,
    wait_all,
    wait_drained,
)
from reliability.processes import scaled_seconds, sqlite_path

pytestmark = pytest.mark.slow

RATE = 60.0  # messages per second
BASELINE = 4.0  # seconds of soak before the transaction opens
AFTER = 3.0  # seconds of soak after it ends


@dataclass
class Soak:
    """What one run measured: the histories, the hold's monotonic window, and samples
    ``(monotonic time, value)`` taken by the probe during each phase."""

    events: list[dict[str, Any]]
    hold: tuple[float, float]
    samples: dict[str, list[tuple[float, Any]]] = field(default_factory=dict)

    def claims(self, start: float, end: float) -> list[float]:
        return [
            e["seconds"] for e in self.events if e["op"] == "claim" and start <= e["mono"] < end
        ]

    def completed_between(self, start: float, end: float) -> int:
        return sum(
            1
            for e in self.events
            if e["op"] == "settled" and e["kind"] == "complete" and start <= e["mono"] < end
        )


def soak(
    url: str,
    workdir: Path,
    *,
    hold_open: Callable[[], AbstractContextManager[object]],
    probe: Callable[[], Any],
    hold: float,
    at_hold_end: Callable[[], Any] | None = None,
) -> Soak:
    """Run the soak with the transaction ``hold_open()`` held for ``hold`` seconds;
    ``probe()`` is sampled every quarter second, ``at_hold_end()`` once just before the
    transaction ends (its result is the sample ``"hold_end"``)."""
    faults = HistoryWriter(workdir, "faults")
    stop_file = workdir / "stop"
    samples: dict[str, list[tuple[float, Any]]] = {"baseline": [], "hold": [], "after": []}

    def sample_for(phase: str, seconds: float) -> None:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            samples[phase].append((time.monotonic(), probe()))
            time.sleep(0.25)

    with agents() as started:
        worker = consumer(url, workdir, "consumer", poll_interval=0.5, time_claims=1)
        started.append(worker)
        worker.wait_ready()
        publisher = producer(url, workdir, "producer", rate=RATE, stop_file=stop_file)
        started.append(publisher)
        publisher.wait_ready()
        sample_for("baseline", BASELINE)
        with hold_open():
            faults.record("hold_begin")
            began = time.monotonic()
            sample_for("hold", hold)
            if at_hold_end is not None:
                samples["hold_end"] = [(time.monotonic(), at_hold_end())]
            ended = time.monotonic()
            faults.record("hold_end")
        sample_for("after", AFTER)
        stop_file.touch()
        wait_all([publisher], timeout=60)
        wait_drained(url, timeout=60)
        assert worker.alive, worker.log()
        assert worker.stop() == 0, worker.log()
    return Soak(read_histories(workdir), (began, ended), samples)


def assert_claims_bounded(run: Soak, *, bound: float) -> str:
    """The median claim while the transaction was open, against the baseline's median."""
    began, ended = run.hold
    first_publish = min(e["mono"] for e in run.events if e["op"] == "publish")
    baseline = run.claims(first_publish + 0.5, began)
    held = run.claims(began, ended)
    after = run.claims(ended, float("inf"))
    ratio = statistics.median(held) / statistics.median(baseline)
    report = (
        f"claims baseline {describe(baseline)}\n  held {describe(held)}\n"
        f"  after {describe(after)}\n  median ratio held/baseline={ratio:.2f}"
    )
    print(f"\n{report}")
    assert ratio <= bound, report
    return report


# --- PostgreSQL ------------------------------------------------------------------------------


def dead_tuples(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'sqlbroker_message'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def vacuum(url: str) -> int:
    """VACUUM the message table; return the dead tuples it had to leave behind."""
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("VACUUM sqlbroker_message")
    return dead_tuples(url)


@pytest.mark.postgres
def test_postgresql_dead_tuples_recover_after_a_long_transaction(
    pg_url: str, tmp_path: Path
) -> None:
    @contextmanager
    def repeatable_read() -> Iterator[object]:
        with psycopg.connect(pg_url) as pg:
            pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            pg.execute("SELECT count(*) FROM sqlbroker_message").fetchone()
            pg.execute("SELECT pg_current_xact_id()").fetchone()
            yield pg
            pg.rollback()

    hold = scaled_seconds(8.0)
    run = soak(
        pg_url,
        tmp_path,
        hold_open=repeatable_read,
        probe=lambda: dead_tuples(pg_url),
        hold=hold,
        at_hold_end=lambda: vacuum(pg_url),
    )
    pinned = run.samples["hold_end"][0][1]
    recovered = vacuum(pg_url)
    verdict = verdict_for(run.events, pg_url, subscriptions=["jobs"])
    churned = run.completed_between(*run.hold)
    print(
        f"\n{verdict.summary()}\ncompleted while held={churned}"
        f" dead tuples: baseline max={max(v for _, v in run.samples['baseline'])}"
        f" held max={max(v for _, v in run.samples['hold'])}"
        f" after VACUUM while held={pinned} after VACUUM once ended={recovered}"
    )
    verdict.assert_clean()
    # Every message completed while the transaction was open left at least its deleted
    # row behind, which no VACUUM may remove while the snapshot could still see it.
    assert pinned >= churned / 2, (pinned, churned)
    assert recovered <= max(20, pinned // 20), (recovered, pinned)
    # Dead index entries the claim's index scan must step over pile up while the horizon
    # is pinned, so claims slow down in proportion to the churn (about 500 rows here). A
    # claim that stays within ten times the baseline's median is bounded; a runaway (a
    # sequential scan, a lock wait on the held transaction) would be far beyond that.
    assert_claims_bounded(run, bound=10)


# --- SQLite ----------------------------------------------------------------------------------


class WalProbe:
    """Reads ``(WAL bytes, frames in use, frames backfilled)``: the frame counts are the
    WAL-index header's ``mxFrame`` and its checkpoint info's ``nBackfill``, read from the
    ``-shm`` file without taking part (a ``PRAGMA wal_checkpoint`` would checkpoint).

    The ``-shm`` file stays open until :meth:`close`: closing any descriptor of a file
    drops every POSIX lock this process holds on it, the long reader's read lock included.
    """

    def __init__(self, database: str) -> None:
        self._database = database
        self._shm: int | None = None

    def __call__(self) -> tuple[int, int, int]:
        if self._shm is None:  # it exists while a connection is open: the workers' are
            self._shm = os.open(f"{self._database}-shm", os.O_RDONLY)
        header = os.pread(self._shm, 100, 0)
        frames = struct.unpack_from("=I", header, 16)[0]
        backfilled = struct.unpack_from("=I", header, 96)[0]
        return os.path.getsize(f"{self._database}-wal"), frames, backfilled

    def close(self) -> None:
        if self._shm is not None:
            os.close(self._shm)


def test_sqlite_the_wal_is_checkpointed_back_after_a_long_reader(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/soak.db"
    database = sqlite_path(url)
    workdir = tmp_path / "histories"
    workdir.mkdir()
    with sqlbroker.Broker(url) as broker:  # the schema, for the reader to read
        broker.migrate()

    @contextmanager
    def reader() -> Iterator[object]:
        conn = sqlite3.connect(database, isolation_level=None)
        try:
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM sqlbroker_message").fetchone()
            yield conn
            conn.execute("COMMIT")
        finally:
            conn.close()

    probe = WalProbe(database)
    try:
        run = soak(url, workdir, hold_open=reader, probe=probe, hold=scaled_seconds(6.0))
    finally:
        probe.close()
    verdict = verdict_for(run.events, url, subscriptions=["jobs"])

    def frames(phase: str) -> list[int]:
        return [state[1] for _, state in run.samples[phase]]

    held_end = run.samples["hold"][-1][1]
    after_end = run.samples["after"][-1][1]
    print(
        f"\n{verdict.summary()}\nWAL frames in use: baseline max={max(frames('baseline'))}"
        f" held max={max(frames('hold'))} (backfilled {held_end[2]})"
        f" after: {frames('after')}\nWAL bytes: baseline max="
        f"{max(s[0] for _, s in run.samples['baseline'])} held end={held_end[0]}"
        f" after end={after_end[0]}"
    )
    verdict.assert_clean()
    # While the reader is open, checkpoints stop at its snapshot and the WAL grows past
    # anything the baseline's checkpoints let it reach.
    assert max(frames("hold")) > 2 * max(frames("baseline"))
    assert held_end[2] < held_end[1]
    # Once it ends, a checkpoint backfills everything and the WAL restarts from its
    # beginning: the frames in use drop back, and the file stops growing (it is reused).
    assert min(frames("after")) < max(frames("baseline")) * 2
    assert min(frames("after")) < max(frames("hold")) / 2
    assert after_end[0] <= held_end[0] * 1.1
    claims_bound = 10
    assert_claims_bounded(run, bound=claims_bound)
