"""Real processes for the reliability scenarios, the faults injected into them, and sizes.

A :class:`Fleet` starts producers (``python -m reliability.producer``) and workers
(``python -m reliability.app``) on one database, each writing its history into the
scenario's directory; :meth:`Fleet.inject` records a fault in the test's own history just
before it sends the signal, so the checker can tie redeliveries to it. Processes still
running at :meth:`Fleet.close` are continued (if stopped) and killed by pid.

``SQLBROKER_FAULTS_SCALE`` (a float, default 1) multiplies every scenario's message counts
and durations: :func:`scaled` and :func:`scaled_seconds`. ``make faults-long`` runs with 10.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sqlite3
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from reliability.checker import Verdict, verdict_for
from reliability.history import Event, HistoryWriter, read_histories
from runtime.support import ModuleProcess, wait_until

SCALE_ENV = "SQLBROKER_FAULTS_SCALE"

SIGNALS = {
    "kill": signal.SIGKILL,
    "stop": signal.SIGSTOP,
    "cont": signal.SIGCONT,
    "term": signal.SIGTERM,
}


def scale() -> float:
    """The size knob: ``SQLBROKER_FAULTS_SCALE``, 1 unless set."""
    value = float(os.environ.get(SCALE_ENV) or 1.0)
    if value <= 0:
        raise ValueError(f"{SCALE_ENV} must be positive, not {value}")
    return value


def scaled(count: int, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``count`` times the scale, within ``minimum`` and ``maximum``."""
    value = max(minimum, round(count * scale()))
    return value if maximum is None else min(value, maximum)


def scaled_seconds(seconds: float) -> float:
    return seconds * scale()


def faketime_library() -> str:
    """libfaketime's multi-threaded variant (``make faketime`` installs it); skips the test
    when missing, except under CI where that is an error."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        message = "libfaketime is missing: make faketime (Debian package faketime)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found[0]


class Fleet:
    """The processes of one scenario on the database ``url``, histories in ``directory``."""

    def __init__(self, url: str, directory: Path) -> None:
        self.url = url
        self.directory = directory
        self.processes: list[ModuleProcess] = []
        self.faults = HistoryWriter(directory, "faults")
        self._counts: dict[str, int] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _unique(self, name: str) -> str:
        self._counts[name] = self._counts.get(name, 0) + 1
        return f"{name}.{self._counts[name]}"

    def _start(
        self, module: str, name: str, faketime: str | None, options: dict[str, Any]
    ) -> ModuleProcess:
        env = {
            "SQLBROKER_URL": self.url,
            "SQLBROKER_HISTORY": str(self.directory),
            "SQLBROKER_NAME": name,
        }
        preload = None
        if faketime is not None:
            preload = faketime_library()
            # Monotonic time stays real: the histories order events by it across processes.
            env |= {"FAKETIME": faketime, "DONT_FAKE_MONOTONIC": "1"}
        process = ModuleProcess(
            module,
            self.directory,
            self._unique(name),
            env=env,
            preload=preload,
            **options,
        )
        self.processes.append(process)
        return process

    def worker(
        self, name: str = "worker", *, faketime: str | None = None, **options: Any
    ) -> ModuleProcess:
        """A ``reliability.app`` worker; ``options`` as in that module (``lease=1.0`` sets
        ``SQLBROKER_LEASE``). ``faketime`` (``"+5m"``) runs it with a skewed wall clock."""
        return self._start("reliability.app", name, faketime, options)

    def producer(self, name: str, *, faketime: str | None = None, **options: Any) -> ModuleProcess:
        """A ``reliability.producer``; one started again under the same ``name`` resumes
        where its predecessor stopped."""
        return self._start("reliability.producer", name, faketime, options)

    def inject(self, process: ModuleProcess, kind: str) -> None:
        """Record the fault ``kind`` (``kill``, ``stop``, ``cont``, ``term``), then send it."""
        self.faults.fault(kind, process.pid)
        process.send(SIGNALS[kind])
        if kind == "kill":
            process.wait(timeout=30)

    def at_work(self, process: ModuleProcess) -> bool:
        """Whether ``process`` runs a handler now, read from its history: a delivery
        started and not yet handled (a kill then leaves something to deliver again)."""
        running: set[tuple[object, object]] = set()
        for path in self.directory.glob(f"*-{process.pid}.jsonl"):
            for line in path.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                handler = (event.get("delivery"), event.get("token"))
                if event["op"] == "deliver":
                    running.add(handler)
                elif event["op"] == "handled":
                    running.discard(handler)
        return bool(running)

    def alive(self, name: str | None = None) -> list[ModuleProcess]:
        return [
            process
            for process in self.processes
            if process.alive and (name is None or process.name.rsplit(".", 1)[0] == name)
        ]

    def stop_all(self, timeout: float = 60.0) -> dict[str, int]:
        """SIGTERM every live process once it is ready (before, the signal would kill it
        while it starts), wait for each, and return their exit statuses."""
        live = self.alive()
        for process in live:
            process.send(signal.SIGCONT)
            process.wait_ready(timeout=timeout)
            process.send(signal.SIGTERM)
        return {process.name: process.wait(timeout=timeout) for process in live}

    def close(self) -> None:
        for process in self.processes:
            if process.alive:
                process.send(signal.SIGCONT)
            process.kill()
        self.faults.close()

    def logs(self) -> dict[str, str]:
        return {process.name: process.log(tail=10**9) for process in self.processes}

    def events(self) -> list[Event]:
        return read_histories(self.directory)

    def verdict(
        self, subscriptions: Collection[str], *, events: list[Event] | None = None, **options: Any
    ) -> Verdict:
        """The checker's verdict on the histories (``events`` when already read) and the
        database's final state."""
        events = self.events() if events is None else events
        return verdict_for(events, self.url, subscriptions=subscriptions, **options)


def finished_count(url: str, subscriptions: Collection[str]) -> int:
    """Copies of ``subscriptions`` that ended (archived or dead), read with plain SQL."""
    names = sorted(subscriptions)
    if url.startswith("sqlite"):
        marks = ", ".join("?" * len(names))
        sql = (
            f"SELECT (SELECT count(*) FROM sqlbroker_archive WHERE subscription IN ({marks}))"
            f" + (SELECT count(*) FROM sqlbroker_dead WHERE subscription IN ({marks}))"
        )
        conn = sqlite3.connect(sqlite_path(url), timeout=30)
        try:
            return int(conn.execute(sql, [*names, *names]).fetchone()[0])
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as pg:
        row = pg.execute(
            "SELECT (SELECT count(*) FROM sqlbroker_archive WHERE subscription = ANY(%(s)s))"
            " + (SELECT count(*) FROM sqlbroker_dead WHERE subscription = ANY(%(s)s))",
            {"s": names},
        ).fetchone()
        assert row is not None
        return int(row[0])


def sqlite_path(url: str) -> str:
    return url.split("///", 1)[1].split("?", 1)[0]


def wait_finished(
    url: str,
    subscriptions: Collection[str],
    total: int,
    *,
    timeout: float,
    while_waiting: Callable[[], None] | None = None,
) -> None:
    """Wait until ``total`` copies of ``subscriptions`` have ended, calling
    ``while_waiting`` (a fault loop's step, say) between looks. ``timeout`` is for scale 1
    and grows with the scale."""

    def done() -> bool:
        if while_waiting is not None:
            while_waiting()
        return finished_count(url, subscriptions) >= total

    limit = timeout * max(1.0, scale())
    wait_until(done, timeout=limit, what=f"{total} messages to finish", interval=0.2)


class SizeSampler:
    """Samples a file's size every ``interval`` seconds in a thread; ``maximum`` is the
    largest seen (a missing file counts as 0)."""

    def __init__(self, path: str | Path, interval: float = 0.02) -> None:
        self.path = Path(path)
        self.interval = interval
        self.maximum = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="size-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            self.maximum = max(self.maximum, size)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
