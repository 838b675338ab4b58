"""One source of result hints per backend, shared by every waiting ``broker.result``.

A waiting lookup registers a :class:`Waiter` for its message id and sleeps on it; one
thread of the backend's (started on first use, stopped by ``close``) runs the backend's
*source* — LISTEN on PostgreSQL, the ``PRAGMA data_version`` watcher on SQLite — and wakes
the waiters of the message id it hears about, or every waiter for a hint about no message in
particular (a dead letter, any SQLite commit, a (re)connect after which notifications may
have been lost). So a thousand waiting callers cost one connection, not a thousand, and a
coroutine waits on its own loop (the source hands the hint over), with no thread of its own.

Hints are hints: the waiter looks the result up again after each, and a bounded fallback
look (features/results.py) covers a lost one. A source that cannot connect leaves the
waiters to that fallback rather than failing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Hint = Callable[[str | None], None]
Source = Callable[[Hint, threading.Event, threading.Event], None]
"""``source(hint, ready, stop)``: run until ``stop`` is set, calling ``hint(message_id)``
(``None``: any message) and setting ``ready`` once it listens."""

READY_TIMEOUT = 10.0
"""How long a first waiter waits for the source to listen before it relies on the
fallback look instead."""


class Waiter:
    """One waiting lookup's hints, for a blocking caller (:meth:`wait`) or a coroutine
    (:meth:`wait_async`, on the loop that first awaits it)."""

    def __init__(self, hub: ResultHub) -> None:
        self._hub = hub
        self._hinted = threading.Event()
        self._on_loop: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def wake(self) -> None:
        self._hinted.set()
        on_loop = self._on_loop  # read after the flag: see wait_async
        if on_loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                on_loop[0].call_soon_threadsafe(on_loop[1].set)

    def _taken(self) -> bool:
        # Cleared before the caller looks again: a hint after this is not lost, and one
        # before it is covered by that look.
        woke = self._hinted.is_set()
        self._hinted.clear()
        if self._on_loop is not None:
            self._on_loop[1].clear()
        return woke

    def wait(self, timeout: float) -> bool:
        """Block until a hint (``True``) or ``timeout`` seconds (``False``)."""
        self._hinted.wait(timeout)
        return self._taken()

    async def wait_async(self, timeout: float) -> bool:
        """:meth:`wait` on the running loop."""
        if self._on_loop is None:
            self._on_loop = (asyncio.get_running_loop(), asyncio.Event())
        # A hint before the line above set the flag, which is read now; one after it
        # also sets the loop's event.
        if not self._hinted.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._on_loop[1].wait()
        return self._taken()

    def ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Block until the source listens (or ``timeout`` seconds): a hint sent after this
        is not missed."""
        self._hub.ready.wait(timeout)
        self._taken()

    async def ready_async(self, timeout: float = READY_TIMEOUT) -> None:
        """:meth:`ready` on the running loop (the source's ``ready`` wakes every waiter)."""
        deadline = time.monotonic() + timeout
        while not self._hub.ready.is_set() and (left := deadline - time.monotonic()) > 0:
            await self.wait_async(left)
        self._taken()


class _Ready(threading.Event):
    """The source's ``ready``: setting it wakes the waiters waiting for it."""

    def __init__(self, hint: Hint) -> None:
        super().__init__()
        self._hint = hint

    def set(self) -> None:
        super().set()
        self._hint(None)


class ResultHub:
    def __init__(self, source: Source) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = {}
        self._thread: threading.Thread | None = None
        self.ready: threading.Event = _Ready(self.hint)
        self._stop = threading.Event()

    def hint(self, message_id: str | None) -> None:
        with self._lock:
            if message_id is None:
                woken = [w for waiters in self._waiters.values() for w in waiters]
            else:
                woken = list(self._waiters.get(message_id, ()))
        for waiter in woken:
            waiter.wake()

    def register(self, message_id: str) -> Waiter:
        """A waiter for hints about ``message_id``, the source started if it is not yet;
        :meth:`unregister` it when done."""
        waiter = Waiter(self)
        with self._lock:
            self._waiters.setdefault(message_id, set()).add(waiter)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._source,
                    args=(self.hint, self.ready, self._stop),
                    name="sqlbroker-result",
                    daemon=True,
                )
                self._thread.start()
        return waiter

    def unregister(self, message_id: str, waiter: Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(message_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[message_id]

    @contextmanager
    def watch(self, message_id: str) -> Iterator[Waiter]:
        waiter = self.register(message_id)
        try:
            waiter.ready()
            yield waiter
        finally:
            self.unregister(message_id, waiter)

    def close(self) -> None:
        """Stop the source (it ends within its own pause; not joined)."""
        self._stop.set()
