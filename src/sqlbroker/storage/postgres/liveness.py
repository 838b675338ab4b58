"""Telling live PostgreSQL connections from dead ones without a round trip: a poll of an
idle pooled connection's socket, watchdogs that shut down a connection that gave no answer
within ``network_timeout``, and the pool checks that follow a lost connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
from psycopg_pool import ConnectionPool

from sqlbroker.core.errors import ConnectionLost
from sqlbroker.storage.postgres.errors import AsyncConn, Conn


class Watch:
    """One checked-out connection under a :class:`Watcher` or a :class:`LoopWatcher`."""

    __slots__ = ("conn", "deadline", "fired", "seconds")

    def __init__(self, conn: Conn | AsyncConn, seconds: float) -> None:
        self.conn = conn
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.fired = False

    def lost(self, *, write: bool) -> ConnectionLost:
        return ConnectionLost(
            f"no answer from PostgreSQL within {self.seconds:g} s (network_timeout);"
            " the connection was closed",
            ambiguous=write,
        )


class Watcher:
    """Watches the sync pool's connections, which block a thread each: one thread of its
    own (started on first use) looks at the connections checked out every tenth of
    ``seconds`` (at most every second) and shuts down those out for longer. A checkout
    costs a dict insert and a pop, not a timer."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._out: dict[int, Watch] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, conn: Conn | AsyncConn) -> Watch:
        watch = Watch(conn, self._seconds)
        with self._lock:
            self._out[id(conn)] = watch
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="sqlbroker-watcher", daemon=True
                )
                self._thread.start()
        return watch

    def release(self, conn: Conn | AsyncConn) -> None:
        with self._lock:
            self._out.pop(id(conn), None)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self._seconds / 10)):
            with self._lock:
                _sever_late(self._out)


def _sever_late(out: dict[int, Watch]) -> None:
    """Shut down the connections of ``out`` past their deadline (each once)."""
    now = time.monotonic()
    late = [watch for watch in out.values() if watch.deadline <= now and not watch.fired]
    for watch in late:
        watch.fired = True
        sever(watch.conn)


class LoopWatcher:
    """Watches the connections of one event loop (its pool's, a LISTEN session's health
    check): while any is checked out, one timer of the loop looks at them every tenth of
    ``seconds`` (at most every second) and shuts down those out for longer. A checkout
    costs a dict insert and a pop, not a timer (a timer per checkout, cancelled at once,
    also fills the loop's heap: each later timer then costs more comparisons)."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._every = min(1.0, seconds / 10)
        self._out: dict[int, Watch] = {}
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, conn: Conn | AsyncConn) -> Watch:
        watch = self._out[id(conn)] = Watch(conn, self._seconds)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._every, self._look)
        return watch

    def release(self, conn: Conn | AsyncConn) -> None:
        self._out.pop(id(conn), None)

    def _look(self) -> None:
        _sever_late(self._out)
        self._timer = (
            asyncio.get_running_loop().call_later(self._every, self._look) if self._out else None
        )


@contextlib.contextmanager
def answered(watcher: Watcher | LoopWatcher, conn: Conn | AsyncConn) -> Iterator[None]:
    """A health check's round trip on ``conn`` (a LISTEN session's, which otherwise only
    waits), held to the watcher's ``network_timeout``: with no answer by then the watcher
    shuts the connection down, and the driver's error becomes :class:`ConnectionLost`."""
    watch = watcher.watch(conn)
    try:
        yield
    except psycopg.Error as error:
        if watch.fired:
            raise watch.lost(write=False) from error
        raise
    finally:
        watcher.release(conn)


def sever(conn: Conn | AsyncConn) -> None:
    """Shut the connection's socket down in both directions (a no-op if already closed):
    a statement waiting for an answer then fails at once with the driver's "server closed
    the connection", where psycopg's own cancellation would first try a cancel request
    over the same silent network."""
    with contextlib.suppress(OSError, psycopg.Error):
        duplicate = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()


def sound(conn: Conn | AsyncConn) -> bool:
    """Whether an idle pooled connection still looks usable, without a round trip.

    An idle autocommit session of the pool listens to nothing, so the server has nothing
    to say to it: anything readable on its socket is the end of the session (the server's
    FATAL message and the close that follows a restart or ``pg_terminate_backend``), or
    in rare cases a notice, and a connection is cheap to replace. The test is one
    ``poll`` with no wait, against the round trip of ``ConnectionPool.check_connection``.
    """
    if conn.closed or conn.broken:
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return not poller.poll(0)
    except (OSError, psycopg.Error):
        return False


def check_idle(pool: ConnectionPool[Conn]) -> None:
    """One connection died under us: the server restarted or ended sessions, so the
    pool's idle connections are likely dead too. The pool hands them out unchecked (a
    check on every checkout costs a round trip on the hot path), so test them now: the
    next operations get live ones instead of each failing on a dead one in turn."""
    with contextlib.suppress(Exception):  # a closed pool, a server still down: no matter
        pool.check()


def drain(pool: ConnectionPool[Conn]) -> None:
    """Replace every connection of the pool (idle ones now, busy ones when returned)."""
    with contextlib.suppress(Exception):
        pool.drain()
