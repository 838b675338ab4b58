"""Fixtures for the observability tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def worker_process() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes a test started; any still running at teardown are killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()
