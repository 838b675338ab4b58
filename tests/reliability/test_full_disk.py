"""Full disks under load (issue 25, part 6).

The database lives on a small tmpfs of the test's own: PostgreSQL's whole data directory
(``base``, ``pg_wal`` with 1 MiB segments, ``pg_xact``, its log), or a SQLite file with its
WAL and shared-memory file. Worker processes consume and producer processes publish
padded messages; a filler file then takes all but the last bytes of the disk and the load
fills those. While the disk is full a publish must fail with sqlbroker's ``StorageFull``
(the same class and wording on both backends, never a driver's exception), a batch publish
must leave none of its rows, and no worker may die. Once the filler is removed, producers
and workers must carry on by themselves, and the checker must find every acknowledged
publish completed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from reliability.checker import verdict_for
from reliability.fulldisk import TmpfsServer, fill, free_bytes, tmpfs
from reliability.history import Event, HistoryWriter, read_histories
from reliability.pgfaults import (
    Agent,
    agents,
    completions,
    consumer,
    first_after,
    producer,
    scalar,
    wait_all,
    wait_drained,
)
from runtime.support import wait_until

pytestmark = pytest.mark.slow

POLL = 1.0
LEASE = 3.0
RATE = 40.0  # messages per second and producer
PAD = 2000  # bytes of padding per payload, so that the load fills the last bytes quickly
LEAVE = 1 << 18  # bytes the filler leaves free
WARM = 2.0  # seconds of load before the disk is filled
HOLD = 3.0  # seconds the disk stays full once a publish has failed for it
AFTER = 3.0  # seconds of load after space is freed
CLI = "from sqlbroker.interfaces.cli import main; main()"  # the console script's entry point
FULL = re.compile(
    r"StorageFull: the (PostgreSQL|SQLite) database's disk is full; nothing was written,"
    r" try again once space is freed \(.+\)"
)


@dataclass
class Disk:
    """Where the database's bytes go, and where the filler goes on the same disk."""

    url: str
    directory: Path
    server: TmpfsServer | None = None

    @property
    def filler(self) -> Path:
        return self.directory / "filler"


@pytest.fixture
def postgres_disk() -> Iterator[Disk]:
    """A server that has run a while: its WAL has recycled segments ahead, as
    ``min_wal_size`` keeps them (here 24 of 1 MiB, made by switching segments and two
    checkpoints), so a full disk refuses the tables' growth and the WAL still has room."""
    with own_postgres(size_mb=80, max_wal_size="32MB", min_wal_size="16MB") as disk:
        with psycopg_connect(disk.url) as admin:
            for _ in range(20):
                admin.execute("SELECT txid_current()")
                admin.execute("SELECT pg_switch_wal()")
            admin.execute("CHECKPOINT")
            admin.execute("CHECKPOINT")
        yield disk


@pytest.fixture
def bare_postgres_disk() -> Iterator[Disk]:
    """A new server whose WAL has next to nothing ahead (a few 1 MiB segments)."""
    with own_postgres(size_mb=64, max_wal_size="4MB", min_wal_size="2MB") as disk:
        yield disk


@contextmanager
def own_postgres(*, size_mb: int, **settings: str) -> Iterator[Disk]:
    server = TmpfsServer(size_mb=size_mb, settings=settings)
    try:
        server.start()
        server.create_database("faults")
        url = server.url("faults")
        with sqlbroker.Broker(url, migrate=True) as broker:
            broker.migrate()
        yield Disk(url, server.data_dir, server)
    finally:
        server.stop()


def psycopg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


@pytest.fixture
def sqlite_disk(tmp_path: Path) -> Iterator[Disk]:
    with tmpfs(tmp_path / "disk", size_mb=24) as directory:
        url = f"sqlite:///{directory / 'broker.db'}"
        sqlbroker.Broker(url).close()
        yield Disk(url, directory)


@pytest.mark.postgres
def test_postgres_data_directory_full_under_load(postgres_disk: Disk, tmp_path: Path) -> None:
    fill_under_load(postgres_disk, tmp_path)


def test_sqlite_file_full_under_load(sqlite_disk: Disk, tmp_path: Path) -> None:
    fill_under_load(sqlite_disk, tmp_path)


@dataclass
class Load:
    """The scenario's worker and producer processes."""

    consumers: list[Agent]
    producers: list[Agent]
    stop_file: Path

    @property
    def dead(self) -> list[tuple[Agent, str]]:
        return [(a, a.log()) for a in self.consumers + self.producers if not a.alive]


def start_load(started: list[Agent], url: str, workdir: Path) -> Load:
    """Two workers, then two producers at ``RATE`` each (one sends every message alone, the
    other batches of four with ``publish_many``), all ready."""
    consumers = [
        consumer(url, workdir, f"consumer{index}", poll_interval=POLL, lease=LEASE, sleep=0.01)
        for index in range(2)
    ]
    started.extend(consumers)
    for agent in consumers:
        agent.wait_ready()
    stop_file = workdir / "stop"
    producers = [
        producer(
            url,
            workdir,
            f"producer{index}",
            rate=RATE,
            batch=1 + 3 * index,
            pad=PAD,
            stop_file=stop_file,
        )
        for index in range(2)
    ]
    started.extend(producers)
    for agent in producers:
        agent.wait_ready()
    return Load(consumers, producers, stop_file)


def finish_load(load: Load, url: str) -> None:
    """Stop the producers, let the workers drain the queue, then stop them: each must be
    alive still, exit 0 and have logged no traceback."""
    load.stop_file.touch()
    wait_all(load.producers, timeout=120)
    wait_drained(url, timeout=60)
    dead = [agent for agent in load.consumers if not agent.alive]
    assert not dead, f"worker processes died: {[(a, a.log()) for a in dead]}"
    for agent in load.consumers:
        assert agent.stop() == 0, agent.log()
        assert "Traceback" not in agent.log(tail=10**7), agent.log()


@dataclass
class LoadReport:
    """What the producers saw, and how soon the load resumed after ``since``."""

    errors: Counter[str]
    full: list[str]
    first_publish: float | None
    first_completion: float | None
    since: float

    @classmethod
    def of(cls, events: list[Event], since: float) -> LoadReport:
        publishes = [e for e in events if e["op"] == "publish"]
        return cls(
            errors=Counter(e["error"].split(":")[0] for e in publishes if e.get("error")),
            full=[e["error"] for e in publishes if e.get("error", "").startswith("StorageFull")],
            first_publish=first_after(
                sorted(e["mono"] for e in publishes if e["status"] == "ok"), since
            ),
            first_completion=first_after(completions(events), since),
            since=since,
        )

    def resumed(self) -> str:
        return (
            f"first publish {_seconds(self.first_publish, self.since)}, first completion"
            f" {_seconds(self.first_completion, self.since)}"
        )

    def assert_resumed(self) -> None:
        """Producers and workers resumed by themselves, within ten poll intervals (the
        bound of the server-restart scenario)."""
        assert self.first_publish is not None, "no publish succeeded afterwards"
        assert self.first_completion is not None, "no completion afterwards"
        assert self.first_publish - self.since <= 10 * POLL
        assert self.first_completion - self.since <= 10 * POLL


def fill_under_load(disk: Disk, workdir: Path) -> None:
    url = disk.url
    faults = HistoryWriter(workdir, "faults")
    with agents() as started:
        load = start_load(started, url, workdir)
        time.sleep(WARM)
        faults.fault("disk_full", "disk")
        filled = time.monotonic()
        fill(disk.filler, leave=LEAVE)
        wait_until(
            lambda: first_full(read_histories(workdir)),
            timeout=60,
            what="a publish refused for the full disk",
            interval=0.1,
        )
        refused_at = time.monotonic()
        batch = publish_batches_while_full(url, workdir)
        time.sleep(HOLD)
        left = free_bytes(disk.directory)
        assert not load.dead, f"processes died on the full disk: {load.dead}"
        if disk.server is not None:
            # Not what this test is about (the WAL test below is): the WAL had to create
            # a segment on the full disk, and the server crashed instead of refusing.
            assert disk.server.postmaster_alive(), "the server crashed: its WAL ran out"
        faults.fault("space_freed", "disk")
        disk.filler.unlink()
        freed = time.monotonic()
        time.sleep(AFTER)
        finish_load(load, url)

    events = read_histories(workdir)
    verdict = verdict_for(events, url, subscriptions=["jobs"], lease=LEASE)
    outcome = LoadReport.of(events, freed)
    print(
        f"\n{url.split(':')[0]}: load refused {refused_at - filled:.2f} s after the fill;"
        f" {left} bytes free while full; publish errors {dict(outcome.errors)};"
        f" batches while full {batch}; after space was freed: {outcome.resumed()}"
        f"\n{verdict.summary()}"
    )
    verdict.assert_clean()
    # The disk really filled, and a publish was told so in sqlbroker's words alone: the
    # same class and wording on both backends.
    assert outcome.full, "no publish failed for the full disk"
    assert all(FULL.fullmatch(error) for error in outcome.full), set(outcome.full)
    assert set(outcome.errors) == {"StorageFull"}, outcome.errors
    # A batch refused for the full disk left none of its rows (the checker also finds any
    # row of a definitely failed publish: its "unexpected").
    assert batch["refused"] == 1, batch
    assert batch["rows_of_refused"] == 0, batch
    outcome.assert_resumed()


@pytest.mark.postgres
def test_postgres_wal_full_crashes_the_server_and_clients_come_back(
    bare_postgres_disk: Disk, tmp_path: Path
) -> None:
    """The one write PostgreSQL cannot refuse politely is its WAL's: a new segment needed
    on a full disk PANICs the server, and its crash recovery, which needs one too, fails,
    so the postmaster shuts down. Clients see ``ConnectionLost`` and must neither die nor
    need a restart: once space is freed and the server is started again (as systemd or
    Patroni would), they carry on by themselves and nothing acknowledged is lost. The
    segment is forced with ``pg_switch_wal()`` on the full disk, where a busy server
    would need one sooner or later."""
    url = bare_postgres_disk.url
    server = bare_postgres_disk.server
    assert server is not None
    workdir = tmp_path
    faults = HistoryWriter(workdir, "faults")
    with agents() as started:
        load = start_load(started, url, workdir)
        time.sleep(WARM)
        faults.fault("disk_full", "disk")
        fill(bare_postgres_disk.filler, leave=0)
        faults.fault("restart", "server")  # the crash to come: claims it forgets are explained
        crashed = force_wal_segment(url)
        wait_until(
            lambda: not server.postmaster_alive(),
            timeout=60,
            what="the server to shut down after its failed crash recovery",
            interval=0.1,
        )
        down = time.monotonic()
        time.sleep(HOLD)  # the load runs on against a server that is down
        assert not load.dead, f"processes died while the server was down: {load.dead}"
        faults.fault("space_freed", "disk")
        bare_postgres_disk.filler.unlink()
        # The server accepts connections before pg_ctl, polling every 0.1 s, sees it ready:
        # the outage ends when it is started, not when start_again() returns.
        starting = time.monotonic()
        server.start_again()
        back = time.monotonic()
        faults.record("server_back", seconds=back - crashed)
        time.sleep(AFTER)
        finish_load(load, url)

    events = read_histories(workdir)
    verdict = verdict_for(events, url, subscriptions=["jobs"], lease=LEASE)
    outcome = LoadReport.of(events, back)
    print(
        f"\nWAL full: publish errors {dict(outcome.errors)}; after the server was started"
        f" again: {outcome.resumed()}\n{verdict.summary()}"
    )
    verdict.assert_clean()
    # While the server was down nothing was acknowledged (publishes in flight at the crash
    # raise ConnectionLost; later ones wait for a connection up to connect_timeout). A
    # producer records an acknowledgement after it arrived, and ``down`` is when this test
    # saw the server gone (polled every 0.1 s): one second covers that recording lag.
    assert not [
        e
        for e in events
        if e["op"] == "publish" and down + 1.0 < e["mono"] < starting and e["status"] == "ok"
    ]
    assert set(outcome.errors) <= {"StorageFull", "ConnectionLost"}, outcome.errors
    assert all(FULL.fullmatch(error) for error in outcome.full), set(outcome.full)
    outcome.assert_resumed()


def force_wal_segment(url: str) -> float:
    """Make the server start a WAL segment (a transaction id, then ``pg_switch_wal()``)
    until the connection breaks; return when it did (monotonic)."""
    import psycopg

    with psycopg_connect(url) as admin:
        for _ in range(100):
            try:
                admin.execute("SELECT txid_current()")
                admin.execute("SELECT pg_switch_wal()")
            except psycopg.OperationalError:
                return time.monotonic()
    raise AssertionError("the server wrote 100 WAL segments on a full disk")


def first_full(events: list[Event]) -> bool:
    return any(
        e["op"] == "publish" and e.get("error", "").startswith("StorageFull") for e in events
    )


def publish_batches_while_full(url: str, workdir: Path) -> dict[str, int]:
    """Batches of 20 padded messages (``publish_many``, one idempotency key each) until one
    is refused, every outcome in a history of its own; then count the refused batch's rows
    in every table of the database."""
    writer = HistoryWriter(workdir, "batches")
    refused: list[str] = []
    accepted = 0
    with sqlbroker.Broker(url) as broker:
        for attempt in range(200):
            tags = [f"batch{attempt}-{index}" for index in range(20)]
            try:
                ids = broker.publish_many(
                    {
                        "topic": "jobs",
                        "payload": {"tag": tag, "pad": "x" * PAD},
                        "idempotency_key": tag,
                    }
                    for tag in tags
                )
            except sqlbroker.StorageFull as error:
                for tag in tags:
                    writer.publish_failed(tag, error, ikey=tag)
                refused = tags
                break
            for tag, message_id in zip(tags, ids, strict=True):
                writer.published(tag, message_id, ikey=tag)
            accepted += 1
            time.sleep(0.05)
    writer.close()
    rows = 0
    if refused:
        for table in (
            "sqlbroker_message",
            "sqlbroker_archive",
            "sqlbroker_dead",
            "sqlbroker_dedupe",
        ):
            rows += int(
                scalar(
                    url,
                    f"SELECT count(*) FROM {table} WHERE idempotency_key LIKE"
                    f" '{refused[0].split('-')[0]}-%'",
                )
            )
    return {"accepted": accepted, "refused": 1 if refused else 0, "rows_of_refused": rows}


def _seconds(moment: float | None, since: float) -> str:
    return "never" if moment is None else f"{moment - since:.2f} s"


@pytest.mark.parametrize(
    "disk_fixture", ["sqlite_disk", pytest.param("postgres_disk", marks=pytest.mark.postgres)]
)
def test_the_cli_on_a_full_disk_says_so_in_one_line(
    disk_fixture: str, request: pytest.FixtureRequest
) -> None:
    """A full disk is no bad input: ``sqlbroker send`` prints the one ``error:`` line of
    every operational failure and exits 1, in the same words on both backends."""
    disk: Disk = request.getfixturevalue(disk_fixture)
    # Open first: on a full disk SQLite cannot even create its shared-memory file (the
    # last connection to close removes it), and opening raises StorageFull too.
    with sqlbroker.Broker(disk.url) as broker:
        fill(disk.filler, leave=0)
        # Whatever room the database's own pages still had is taken too.
        for index in range(10_000):
            try:
                broker.send("jobs", {"pad": "x" * PAD}, idempotency_key=f"last-{index}")
            except sqlbroker.StorageFull:
                break
        else:
            raise AssertionError("10,000 sends fitted on a full disk")
        env = {k: v for k, v in os.environ.items() if k != "SQLBROKER_DEBUG"}
        done = subprocess.run(
            [sys.executable, "-c", CLI, "send", "jobs", "-"],
            input=json.dumps({"pad": "x" * 100_000}),
            env={**env, "SQLBROKER_URL": disk.url, "NO_COLOR": "1"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    assert FULL.fullmatch(line.replace("error: ", "StorageFull: ", 1)), line
