"""The seam's conformance suite: ``Backend``, ``Tx`` and ``AsyncTx`` driven directly, on
both dialects (like River's ``riverdrivertest``). The broker-level suites sit on top."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.storage.factory import open_backend


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def backend(backend_url: str, clock: ManualClock) -> Iterator[Any]:
    """A migrated backend on a test clock (``Any``: the old protocol and the new seam are
    both on it while the operation groups move)."""
    opened: Any = open_backend(backend_url, clock=clock)
    opened.migrate()
    try:
        yield opened
    finally:
        opened.close()
