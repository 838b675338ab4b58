"""PostgreSQL's LISTEN sessions: the worker's wake-ups (new messages, cancels) on the
running loop, and the source of the result hub's hints on a thread of its own (see
:mod:`sqlbroker.storage.result_hub`). Each is one connection of its own, re-established with
backoff; after every (re)connect it hints "anything" (``None``), since notifications sent
while nobody listened are gone. Behind a transaction pooler without ``listen_url`` there
is no LISTEN: the callers' polls alone find the work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import psycopg
from psycopg import sql

from sqlbroker.core.errors import ConnectionLost
from sqlbroker.storage.postgres.liveness import LoopWatcher, Watcher, answered
from sqlbroker.storage.postgres.options import SessionOptions
from sqlbroker.storage.result_hub import Hint, Source
from sqlbroker.storage.url import redact

log = logging.getLogger("sqlbroker.storage")
_RESULT_PAUSE = 0.5
"""Seconds between two checks of the stop flag while the result source listens."""


def _health_every(options: SessionOptions) -> float:
    """Seconds a LISTEN session waits for notifications before it asks the server (the
    ``health_check`` statement), and then gives it to answer (a watcher shuts the session
    down after that): a session gone silent (a peer lost, its TCP session kept alive by a
    proxy in between, where keepalives see nothing wrong) would otherwise wait for ever.
    Half ``network_timeout`` each, so such a session is found within ``network_timeout``."""
    return options.network_timeout / 2


def _listen(blocks: Mapping[str, str], channels: Sequence[str]) -> list[sql.Composed]:
    return [sql.SQL(blocks["listen"]).format(channel=sql.Identifier(name)) for name in channels]


async def listen(
    options: SessionOptions,
    blocks: Mapping[str, str],
    *,
    channel: str,
    cancel_channel: str | None,
    on_hint: Callable[[str | None], None],
    on_cancel: Callable[[str], None] | None,
) -> None:
    """The worker's wake-ups (``Backend.listen_async``), on the caller's loop rather than a
    thread of its own: a notification reaches the claim without a hop between threads."""
    cancels = cancel_channel if on_cancel is not None else None
    statements = _listen(blocks, [channel] + ([cancels] if cancels else []))
    pause = 0.1
    health_every = _health_every(options)
    watcher = LoopWatcher(health_every)
    target = options.listen_target()
    if target is None:
        log.info("no LISTEN behind a transaction pooler (no listen_url): polling only")
        on_hint(None)
        await asyncio.Event().wait()
        return
    conninfo, kwargs = target
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(conninfo, **kwargs) as conn:
                for statement in statements:
                    await conn.execute(statement)
                pause = 0.1
                on_hint(None)
                while True:
                    async for notice in conn.notifies(timeout=health_every):
                        if on_cancel is not None and notice.channel == cancels:
                            on_cancel(notice.payload)
                        else:
                            on_hint(notice.payload or None)
                    with answered(watcher, conn):
                        await conn.execute(blocks["health_check"])
        except (psycopg.Error, ConnectionLost) as error:
            log.warning(
                "LISTEN connection lost (%s); reconnecting in %.1f s",
                redact(str(error)).strip(),
                pause,
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)


def result_source(
    options: SessionOptions,
    blocks: Mapping[str, str],
    *,
    result_channel: str,
    dead_channel: str,
) -> Source:
    """The result hub's source: a stored value's NOTIFY carries its message id, a dead
    letter's its subscription (any waiter may be concerned)."""
    statements = _listen(blocks, [dead_channel, result_channel])
    health_every = _health_every(options)

    def source(hint: Hint, ready: threading.Event, stop: threading.Event) -> None:
        pause = 0.1
        target = options.listen_target()
        if target is None:  # behind a transaction pooler: the waiters' own looks alone
            ready.set()
            return
        conninfo, kwargs = target
        # Its thread starts with the first health check and ends with the source.
        with contextlib.closing(Watcher(health_every)) as watcher:
            while not stop.is_set():
                try:
                    with psycopg.Connection.connect(conninfo, **kwargs) as conn:
                        for statement in statements:
                            conn.execute(statement)
                        pause = 0.1
                        ready.set()
                        hint(None)
                        asked = time.monotonic()
                        while not stop.is_set():
                            for notice in conn.notifies(timeout=_RESULT_PAUSE):
                                hint(None if notice.channel == dead_channel else notice.payload)
                            if time.monotonic() - asked >= health_every:
                                with answered(watcher, conn):
                                    conn.execute(blocks["health_check"])
                                asked = time.monotonic()
                except (psycopg.Error, ConnectionLost) as error:
                    log.warning(
                        "the result LISTEN connection failed (%s); retrying in %.1f s",
                        redact(str(error)).strip(),
                        pause,
                    )
                    stop.wait(pause)
                    pause = min(pause * 2, 5.0)

    return source
