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

import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import sqlbroker
from reliability.checker import verdict_for
from reliability.fulldisk import TmpfsServer, fill, free_bytes, tmpfs
from reliability.history import Event, HistoryWriter, read_histories
from reliability.pgfaults import (
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
LEAVE = 1 << 20  # bytes the filler leaves free
WARM = 2.0  # seconds of load before the disk is filled
HOLD = 3.0  # seconds the disk stays full once a publish has failed for it
AFTER = 3.0  # seconds of load after space is freed
FULL = re.compile(
    r"StorageFull: the (PostgreSQL|SQLite) database's disk is full; nothing was written,"
    r" try again once space is freed \(.+\)"
)


@dataclass
class Disk:
    """Where the database's bytes go, and where the filler goes on the same disk."""

    url: str
    directory: Path

    @property
    def filler(self) -> Path:
        return self.directory / "filler"


@pytest.fixture
def postgres_disk() -> Iterator[Disk]:
    # 64 MiB: a fresh cluster with the test's database takes about 32; checkpoints every
    # 4 MiB of WAL keep pg_wal to a few 1 MiB segments, recycled rather than created.
    server = TmpfsServer(size_mb=64, settings={"max_wal_size": "4MB", "min_wal_size": "2MB"})
    try:
        server.start()
        server.create_database("faults")
        url = server.url("faults")
        with sqlbroker.Broker(url, migrate=True) as broker:
            broker.migrate()
        yield Disk(url, server.data_dir)
    finally:
        server.stop()


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


def fill_under_load(disk: Disk, workdir: Path) -> None:
    url = disk.url
    stop_file = workdir / "stop"
    faults = HistoryWriter(workdir, "faults")
    with agents() as started:
        consumers = [
            consumer(url, workdir, f"consumer{index}", poll_interval=POLL, lease=LEASE, sleep=0.01)
            for index in range(2)
        ]
        started.extend(consumers)
        for agent in consumers:
            agent.wait_ready()
        producers = [
            # One sends each message alone, the other in batches of four (publish_many).
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
        dead = [agent for agent in started if not agent.alive]
        assert not dead, f"processes died on the full disk: {[(a, a.log()) for a in dead]}"

        faults.fault("space_freed", "disk")
        disk.filler.unlink()
        freed = time.monotonic()
        time.sleep(AFTER)
        stop_file.touch()
        wait_all(producers, timeout=120)
        wait_drained(url, timeout=60)
        dead = [agent for agent in consumers if not agent.alive]
        assert not dead, f"worker processes died: {[(a, a.log()) for a in dead]}"
        for agent in consumers:
            assert agent.stop() == 0, agent.log()
            assert "Traceback" not in agent.log(tail=10**7), agent.log()

    events = read_histories(workdir)
    verdict = verdict_for(events, url, subscriptions=["jobs"], lease=LEASE)
    errors = Counter(
        e["error"].split(":")[0] for e in events if e["op"] == "publish" and e.get("error")
    )
    full = [e for e in events if e["op"] == "publish" and e.get("error", "").startswith("Storage")]
    first_publish = first_after(
        sorted(e["mono"] for e in events if e["op"] == "publish" and e["status"] == "ok"), freed
    )
    first_completion = first_after(completions(events), freed)
    print(
        f"\n{url.split(':')[0]}: load refused {refused_at - filled:.2f} s after the fill;"
        f" {left} bytes free while full; publish errors {dict(errors)};"
        f" batches while full {batch}; after space was freed: first publish"
        f" {_seconds(first_publish, freed)}, first completion {_seconds(first_completion, freed)}"
        f"\n{verdict.summary()}"
    )
    verdict.assert_clean()
    # The disk really filled, and a publish was told so in sqlbroker's words alone: the
    # same class and wording on both backends. (A PostgreSQL server that cannot write its
    # WAL restarts: its callers then see ConnectionLost, as in any server crash.)
    assert full, "no publish failed for the full disk"
    assert all(FULL.fullmatch(e["error"]) for e in full), {e["error"] for e in full}
    assert set(errors) <= {"StorageFull", "ConnectionLost"}, errors
    # A batch refused for the full disk left none of its rows (the checker also finds any
    # row of a definitely failed publish: its "unexpected").
    assert batch["refused"] >= 1, batch
    assert batch["rows_of_refused"] == 0, batch
    # Producers and workers resumed by themselves once space was freed, within ten poll
    # intervals (the brief bound of the restart scenario), and the load ran on.
    assert first_publish is not None, "no publish succeeded after space was freed"
    assert first_completion is not None, "no completion after space was freed"
    assert first_publish - freed <= 10 * POLL
    assert first_completion - freed <= 10 * POLL


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
