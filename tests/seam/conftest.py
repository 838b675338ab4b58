"""The seam's conformance suite: ``Backend``, ``Tx`` and ``AsyncTx`` driven directly, on
both dialects (like River's ``riverdrivertest``). The broker-level suites sit on top."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.factory import open_backend


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def backend(backend_url: str, clock: ManualClock) -> Iterator[Backend]:
    """A migrated backend on a test clock."""
    opened = open_backend(backend_url, clock=clock)
    opened.migrate()
    try:
        yield opened
    finally:
        opened.close()
