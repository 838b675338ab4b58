"""The threads that run plain-function (sync) handlers.

A sync handler cannot be interrupted: when it outlives its timeout, or a hard stop
abandons it, its thread runs on. ``concurrent.futures.ThreadPoolExecutor`` handles that
badly for a worker: a stuck thread keeps its slot, so the next handler waits in the pool's
queue while its timeout runs (and is counted as failed without ever starting), and the
pool's threads are joined at interpreter exit, so a stopped worker's process lives on until
the stuck call returns. Here an idle thread is reused when there is one and a new thread is
started when there is none; the pump bounds how many handlers run at once, so threads only
outnumber the concurrency while abandoned calls are still running. The threads are daemons:
the process exits without waiting for abandoned calls, whose messages were already handed
back.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Work = tuple[Future[Any], Callable[[], Any]]


class HandlerThreads(Executor):
    """An executor on daemon threads that never makes a call wait for a busy one."""

    def __init__(self, *, thread_name_prefix: str) -> None:
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._shutdown = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot run handlers after the worker stopped")
            self._work.put((future, lambda: fn(*args, **kwargs)))
            # Every queued call is matched by an idle thread that will take it, or a new one.
            if self._idle:
                self._idle -= 1
            else:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"{self._prefix}_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            future, call = work
            del work
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as error:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            del future, call
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; idle threads exit, busy ones when their call returns."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            with contextlib.suppress(queue.Empty):
                while cancel_futures:
                    work = self._work.get_nowait()
                    if work is not None:
                        work[0].cancel()
            threads = list(self._threads)
            for _ in threads:
                self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()
