"""Helpers for the runtime tests: real worker processes, their effects, and polling."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import sqlbroker

T = TypeVar("T")
TESTS_DIR = Path(__file__).resolve().parent.parent


def wait_until(
    predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


RUN_LIMIT = 30.0


def run_until_idle(broker: sqlbroker.Broker, **options: Any) -> float:
    """Run the registered subscribers until idle; return how long it took. The limit only
    guards against a hang: each test checks that the work is really done."""
    started = time.monotonic()
    broker.run_until_idle(timeout=RUN_LIMIT, **options)
    elapsed = time.monotonic() - started
    assert elapsed < RUN_LIMIT - 1, "run_until_idle ran into its timeout instead of going idle"
    return elapsed


class ModuleProcess:
    """One ``python -m <module>`` process with ``tests/`` on its path, its output in
    ``workdir/<name>.log``, configured by environment variables: ``env`` as given, and each
    keyword option ``x=value`` as ``SQLBROKER_X`` (``None`` leaves it unset). It reports
    readiness by creating the file named by ``SQLBROKER_READY``. ``preload`` goes into
    ``LD_PRELOAD`` (libfaketime, say) for this process only."""

    def __init__(
        self,
        module: str,
        workdir: Path,
        name: str,
        *,
        env: dict[str, str] | None = None,
        preload: str | None = None,
        **options: Any,
    ) -> None:
        self.name = name
        self.module = module
        self.ready_path = workdir / f"{name}.ready"
        self.log_path = workdir / f"{name}.log"
        python_path = [str(TESTS_DIR)]
        if os.environ.get("PYTHONPATH"):
            python_path.append(os.environ["PYTHONPATH"])
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(python_path),
            "SQLBROKER_READY": str(self.ready_path),
            **(env or {}),
        }
        if preload is not None:
            full_env["LD_PRELOAD"] = preload
        for option, value in options.items():
            if value is not None:
                full_env[f"SQLBROKER_{option.upper()}"] = str(value)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module],
                env=full_env,
                cwd=TESTS_DIR,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"{kind}({self.name!r}, pid={self.pid}, rc={self.process.poll()})"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self, tail: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if not self.alive:
                raise AssertionError(
                    f"{self.name} exited ({self.process.returncode}) before it was"
                    f" ready:\n{self.log()}"
                )
            return self.ready_path.exists()

        wait_until(ready, timeout=timeout, what=f"{self.name} to be ready")

    def send(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout:g} s:\n{self.log()}"
            ) from None

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait(timeout=30)


class WorkerProcess(ModuleProcess):
    """One ``python -m runtime.workerapp`` process (see workerapp.py for its options)."""

    def __init__(self, url: str, workdir: Path, name: str, effects: Path, **options: Any) -> None:
        super().__init__(
            "runtime.workerapp",
            workdir,
            name,
            env={"SQLBROKER_URL": url, "SQLBROKER_EFFECTS": str(effects)},
            **options,
        )


def read_effects(path: Path) -> list[dict[str, Any]]:
    """The events the handlers recorded, in the order they were written."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(path: Path, event: str, ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
    wanted = None if ids is None else set(ids)
    return [
        e
        for e in read_effects(path)
        if e["event"] == event and (wanted is None or e["id"] in wanted)
    ]


def count_by_id(path: Path, event: str) -> collections.Counter[str]:
    return collections.Counter(e["id"] for e in events(path, event))


def archive_by_message(
    broker: sqlbroker.Broker, subscription: str
) -> dict[str, list[sqlbroker.ArchivedMessage]]:
    """Archived copies of ``subscription``, grouped by message id."""
    grouped: dict[str, list[sqlbroker.ArchivedMessage]] = collections.defaultdict(list)
    for row in broker.archive(subscription, limit=10_000):
        grouped[row.message_id].append(row)
    return dict(grouped)


def assert_all_completed_once(
    broker: sqlbroker.Broker, subscription: str, message_ids: Iterable[str]
) -> dict[str, sqlbroker.ArchivedMessage]:
    """Every message ended completed exactly once; nothing pending or dead."""
    ids = list(message_ids)
    archived = archive_by_message(broker, subscription)
    assert broker.pending(subscription) == []
    assert broker.dead_letters.list(subscription=subscription) == []
    assert set(archived) == set(ids), f"missing {set(ids) - set(archived)}"
    for message_id, rows in archived.items():
        assert len(rows) == 1, f"{message_id} archived {len(rows)} times: {rows}"
        assert rows[0].outcome == sqlbroker.Outcome.COMPLETED, rows[0]
    return {message_id: rows[0] for message_id, rows in archived.items()}
