"""Fixtures for the runtime tests: worker processes and the effects file they share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.support import WorkerProcess


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    """The file every worker process of the test appends its handler events to."""
    return tmp_path / "effects.jsonl"


@pytest.fixture
def spawn_worker(
    backend_url: str, tmp_path: Path, effects: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``python -m runtime.workerapp`` processes on the test's database; any still
    running at teardown are killed (SIGKILL, by pid)."""
    started: list[WorkerProcess] = []

    def spawn(**options: Any) -> WorkerProcess:
        name = options.pop("name", None) or f"worker{len(started) + 1}"
        worker = WorkerProcess(backend_url, tmp_path, name, effects, **options)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.kill()
