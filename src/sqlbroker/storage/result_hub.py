"""One source of result hints per backend, shared by every waiting ``broker.result``.

A waiting lookup registers a waiter for its message id and sleeps on it; one thread of the
backend's (started on first use, stopped by ``close``) runs the backend's *source* — LISTEN
on PostgreSQL, the ``PRAGMA data_version`` watcher on SQLite — and wakes the waiters of the
message id it hears about, or every waiter for a hint about no message in particular (a
dead letter, any SQLite commit, a reconnect after which notifications may have been lost).
So a thousand waiting callers cost one connection, not a thousand.

Hints are hints: the waiter looks the result up again after each, and a bounded fallback
look (features/results.py) covers a lost one. A source that cannot connect leaves the
waiters to that fallback rather than failing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

Hint = Callable[[str | None], None]
Source = Callable[[Hint, threading.Event, threading.Event], None]
"""``source(hint, ready, stop)``: run until ``stop`` is set, calling ``hint(message_id)``
(``None``: any message) and setting ``ready`` once it listens."""

READY_TIMEOUT = 10.0
"""How long a first waiter waits for the source to listen before it relies on the
fallback look instead."""


class _Waiter:
    def __init__(self) -> None:
        self._event = threading.Event()

    def wake(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> bool:
        woke = self._event.wait(timeout)
        # Cleared before the caller looks again: a hint after this is not lost, and one
        # before it is covered by that look.
        self._event.clear()
        return woke


class _AsyncWaiter:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        finally:
            self._event.clear()
        return True


class ResultHub:
    def __init__(self, source: Source, *, name: str) -> None:
        self._source = source
        self._name = name
        self._lock = threading.Lock()
        self._waiters: dict[str, set[_Waiter | _AsyncWaiter]] = {}
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()

    def hint(self, message_id: str | None) -> None:
        with self._lock:
            if message_id is None:
                woken = [w for waiters in self._waiters.values() for w in waiters]
            else:
                woken = list(self._waiters.get(message_id, ()))
        for waiter in woken:
            waiter.wake()

    def _register(self, message_id: str, waiter: _Waiter | _AsyncWaiter) -> None:
        with self._lock:
            self._waiters.setdefault(message_id, set()).add(waiter)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._source,
                    args=(self.hint, self._ready, self._stop),
                    name=self._name,
                    daemon=True,
                )
                self._thread.start()

    def _unregister(self, message_id: str, waiter: _Waiter | _AsyncWaiter) -> None:
        with self._lock:
            waiters = self._waiters.get(message_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[message_id]

    @contextmanager
    def watch(self, message_id: str) -> Iterator[_Waiter]:
        waiter = _Waiter()
        self._register(message_id, waiter)
        try:
            self._ready.wait(READY_TIMEOUT)
            yield waiter
        finally:
            self._unregister(message_id, waiter)

    @asynccontextmanager
    async def watch_async(self, message_id: str) -> AsyncIterator[_AsyncWaiter]:
        waiter = _AsyncWaiter(asyncio.get_running_loop())
        self._register(message_id, waiter)
        try:
            if not self._ready.is_set():
                await asyncio.to_thread(self._ready.wait, READY_TIMEOUT)
            yield waiter
        finally:
            self._unregister(message_id, waiter)

    def close(self) -> None:
        """Stop the source (it ends within its own pause; not joined)."""
        self._stop.set()
