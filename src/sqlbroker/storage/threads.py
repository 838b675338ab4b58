"""A backend's own threads, for the blocking work its coroutines must not do on the loop.

Not the loop's default executor, which user code shares (``asyncio.to_thread``): a small
pool of named threads, created on first use and let go on close.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class OwnThreads:
    """A lazily created thread pool; safe to use from several event loops."""

    def __init__(self, *, name: str, size: int) -> None:
        self._name = name
        self._size = size
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``fn`` on a thread of the pool, in a copy of the caller's context."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn)
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self._size, thread_name_prefix=self._name
                )
            # Submitted under the lock, so that shutdown() cannot slip in between.
            return loop.run_in_executor(self._executor, call)

    def shutdown(self) -> None:
        """Let the threads go once their work is done (without waiting for it, so a
        thread of the pool may call it too); a later :meth:`run` starts a new pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
