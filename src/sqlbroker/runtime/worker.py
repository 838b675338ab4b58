"""The worker: a supervisor of named asyncio tasks over one pump per subscriber.

Lifecycle: ``run()`` ensures the subscriptions exist, starts the pumps and the side tasks
(write-back, lease keepers, cancel watchers, reaper, wake-up listener) and waits for a stop.
A stop — from :meth:`Worker.stop`, SIGTERM or SIGINT — stops fetching, lets running handlers
finish within ``grace`` seconds (and manual acks still due to come), releases
claimed-but-unstarted messages, and writes back every outcome. A second signal (or
``stop(now=True)``) cancels running handlers at once; their messages are handed back for
another attempt. Cancelling ``run_async`` (``asyncio.wait_for``, an application's own
shutdown) stops gracefully too, and raises ``CancelledError`` once that is done; a second
cancellation stops at once. A side task that dies stops the worker gracefully and ``run()``
raises :class:`WorkerCrashed` naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import signal
import socket
import threading
from collections.abc import Awaitable, Sequence
from typing import TypedDict, Unpack

from sqlbroker.client import inspection, publishing, scheduling
from sqlbroker.client.base import BrokerBase
from sqlbroker.client.consuming import worker_name
from sqlbroker.core import validate
from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.observability import WorkerBeat
from sqlbroker.core.sagas import Saga
from sqlbroker.features.faces import drive_async
from sqlbroker.features.sagas import warn_unhandled
from sqlbroker.features.schedules import ScheduleRun
from sqlbroker.features.subscribers import SubscriberSpec
from sqlbroker.runtime.events import Observers, WorkerObserver
from sqlbroker.runtime.handler_threads import HandlerThreads
from sqlbroker.runtime.heartbeat import DEFAULT_HEARTBEAT, MetricsRecorder, run_heartbeat
from sqlbroker.runtime.pump import Pump
from sqlbroker.runtime.scheduler import Scheduler
from sqlbroker.runtime.writeback import (
    DEFAULT_WRITE_BACKLOG,
    DEFAULT_WRITE_BATCH,
    FlushReport,
    WriteBack,
    wait_any,
)
from sqlbroker.storage.backend import Backend

log = logging.getLogger("sqlbroker.runtime")
CANCEL_POLL = 0.5
"""Seconds between looks for cancelled running copies where no notification says so."""
CANCEL_SAFETY_POLL = 5.0
"""The same where a notification announces each cancel (PostgreSQL's NOTIFY)."""


Task = asyncio.Task[None]


class WorkerCrashed(SqlbrokerError):
    """A task of the worker died unexpectedly; the worker stopped after draining."""


class WorkerOptions(TypedDict, total=False):
    """How a worker runs: the keywords of :meth:`Broker.worker`, ``run`` and
    ``run_until_idle`` (besides ``subscriptions`` and ``concurrency``), every one optional.
    Each key's default is in its description and in :class:`Worker`, below."""

    grace: float
    """Seconds a graceful stop waits for running handlers (default 30)."""
    reap_interval: float
    """Seconds between reaper passes: expired leases and TTLs, retention (default 5)."""
    poll_interval: float
    """The longest wait, in seconds, between looks for work when no wake-up comes
    (default 1)."""
    install_signal_handlers: bool
    """Stop on SIGTERM and SIGINT (default ``True``; ``run_until_idle``: ``False``)."""
    heartbeat_interval: float
    """Seconds between the worker's heartbeats, which ``broker.workers()`` reads
    (default 5)."""
    schedules: bool
    """Publish the ticks of durable schedules (default ``True``)."""
    listen: bool
    """Open a wake-up listener (default ``True``): PostgreSQL's LISTEN connection, which a
    transaction-pooling proxy such as PgBouncer cannot carry; SQLite's commit watcher.
    With ``False`` other processes' messages are found by the poll alone, within
    ``poll_interval`` seconds."""
    write_batch: int
    """Outcomes written back per database call (default 500)."""
    write_backlog: int
    """At most this many outcomes and unsettled claims are held at once (default 5000): a
    slow database pauses the claims instead of growing memory."""


class Worker:
    """Runs a broker's subscribers: claims their copies, calls the handlers, settles them.

    Made by :meth:`Broker.worker` (or run by ``broker.run()`` and ``sqlbroker worker``), not
    constructed directly. :meth:`run` blocks until :meth:`stop`, SIGTERM or SIGINT; a stop
    waits up to ``grace`` seconds for running handlers and gives the rest back. Before it
    starts anything it checks the schema and, for each of ``sagas`` (those whose steps it
    runs), warns of steps no handler serves (``SagaWarning``).
    """

    def __init__(
        self,
        broker: BrokerBase,
        specs: Sequence[SubscriberSpec],
        *,
        name: str | None = None,
        observers: Sequence[WorkerObserver] = (),
        sagas: Sequence[Saga] = (),
        **options: Unpack[WorkerOptions],
    ) -> None:
        validate.known_options(options, WorkerOptions.__optional_keys__, "worker")
        if not specs:
            raise SqlbrokerError("no subscribers to run: declare some with @broker.subscriber")
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise SqlbrokerError(f"two subscribers share a subscription name: {names}")
        self._broker = broker
        self._specs = list(specs)
        self._sagas = list(sagas)
        get = options.get
        seconds, integer = validate.seconds, validate.integer
        self._grace = seconds(get("grace", 30.0), "grace", maximum=validate.MAX_LEASE)
        self._reap_interval = seconds(get("reap_interval", 5.0), "reap_interval", allow_zero=False)
        self._poll_max = seconds(get("poll_interval", 1.0), "poll_interval", allow_zero=False)
        self._install_signals = bool(get("install_signal_handlers", True))
        self._schedules = bool(get("schedules", True))
        self._listen = bool(get("listen", True))
        batch = get("write_batch", DEFAULT_WRITE_BATCH)
        self._write_batch = integer(batch, "write_batch", minimum=1, maximum=100_000)
        backlog = get("write_backlog", DEFAULT_WRITE_BACKLOG)
        self._write_backlog = integer(backlog, "write_backlog", minimum=1, maximum=10_000_000)
        self.name = name or worker_name()
        beat = get("heartbeat_interval", DEFAULT_HEARTBEAT)
        self._heartbeat_interval = seconds(
            beat, "heartbeat_interval", allow_zero=False, maximum=3600.0
        )
        self.recorder = MetricsRecorder(self.name)
        self._observers = Observers([self.recorder, *observers])
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._hard: asyncio.Event | None = None
        self._pending_stop: bool | None = None
        self._crash: tuple[str, BaseException] | None = None
        self._pumps: dict[str, Pump] = {}
        self._signals = 0
        self._written: asyncio.Event | None = None  # a flush was written (run_until_idle)

    # --- control -----------------------------------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Stop gracefully (or at once); safe from any thread, also before ``run`` starts."""
        loop = self._loop
        if loop is None or self._stop is None:
            self._pending_stop = bool(self._pending_stop) or now
            return
        loop.call_soon_threadsafe(self._request_stop, now)

    def _request_stop(self, now: bool) -> None:
        assert self._stop is not None
        assert self._hard is not None
        if not self._stop.is_set():
            log.info("worker %s stopping%s", self.name, " at once" if now else "")
        self._stop.set()
        if now:
            self._hard.set()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        log.info("received %s", signal.Signals(signum).name)
        self._request_stop(now=self._signals > 1)

    def hint(self, subscription: str | None) -> None:
        """New work may be claimable (``None``: anywhere); safe from any thread."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._hint, subscription)

    def _hint(self, subscription: str | None) -> None:
        if subscription is None:
            for pump in self._pumps.values():
                pump.wake()
        elif subscription in self._pumps:
            self._pumps[subscription].wake()

    # --- run ---------------------------------------------------------------------------------

    def run(self, *, until_idle: bool = False, timeout: float | None = None) -> None:
        """Blocking run; see :meth:`run_async`."""
        asyncio.run(self.run_async(until_idle=until_idle, timeout=timeout))

    async def run_async(self, *, until_idle: bool = False, timeout: float | None = None) -> None:
        """Run until stopped. ``until_idle`` stops once the subscriptions have no ready,
        scheduled or running messages left; ``timeout`` stops after that many seconds."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop, self._hard = asyncio.Event(), asyncio.Event()
        if self._pending_stop is not None:
            self._request_stop(self._pending_stop)
        backend = self._broker.backend
        try:
            # Each thing started is let go (in the reverse order) however the run ends,
            # also when the schema check fails: it opened the loop's connections.
            async with contextlib.AsyncExitStack() as started:
                await self._broker._ready_async()  # the loop goes on while it reads
                # A saga's check may read the live workers, blocking: on the backend's threads.
                handled, when = self._broker.subscribers, "this worker runs"
                for saga in self._sagas:
                    await backend.offload(
                        functools.partial(warn_unhandled, backend, saga, handled, when=when)
                    )
                handler_threads = HandlerThreads(thread_name_prefix="sqlbroker-handler")
                started.callback(handler_threads.shutdown, wait=False, cancel_futures=True)
                await self._ensure_subscriptions(backend)
                writeback = WriteBack(
                    backend.async_ops.message_settle_many,
                    on_flushed=self._flushed,
                    max_items=self._write_batch,
                    backlog=self._write_backlog,
                    outstanding=lambda: sum(pump.open for pump in self._pumps.values()),
                )
                started.callback(writeback.close)
                self._pumps = {
                    spec.name: Pump(
                        backend=backend,
                        spec=spec,
                        lease=self._broker.lease,
                        worker_name=self.name,
                        writeback=writeback,
                        handler_threads=handler_threads,
                        poll_max=self._poll_max,
                        observer=self._observers,
                        result_limit=self._broker.publish_defaults.payload_limit,
                    )
                    for spec in self._specs
                }
                if self._install_signals and threading.current_thread() is threading.main_thread():
                    for signum in (signal.SIGTERM, signal.SIGINT):
                        loop.add_signal_handler(signum, self._on_signal, signum)
                        started.callback(loop.remove_signal_handler, signum)
                log.info(
                    "worker %s running %s on %s",
                    self.name,
                    ", ".join(self._pumps),
                    getattr(backend, "name", "?"),
                )
                if timeout is not None:
                    seconds = validate.seconds(timeout, "timeout")
                    started.callback(loop.call_later(seconds, self._request_stop, False).cancel)
                supervisor = asyncio.ensure_future(
                    self._supervise(backend, writeback, until_idle=until_idle)
                )
                await self._until_stopped(supervisor)
        finally:
            with contextlib.suppress(Exception):
                await backend.close_async()
            self._loop = None
            self._written = None
        if self._crash is not None:
            name, error = self._crash
            raise WorkerCrashed(f"the worker's {name} task died: {error!r}") from error

    async def _until_stopped(self, supervisor: asyncio.Future[None]) -> None:
        """Await the supervisor. Cancelling ``run_async`` stops the worker gracefully (a
        second cancellation: at once) and is raised again once the shutdown is done, so
        nothing claimed stays leased and no outcome is dropped."""
        cancelled: asyncio.CancelledError | None = None
        while True:
            try:
                await asyncio.shield(supervisor)
                break
            except asyncio.CancelledError as error:
                if supervisor.cancelled():
                    raise
                self._request_stop(now=cancelled is not None)
                cancelled = error
        if cancelled is not None:
            raise cancelled

    async def _supervise(
        self,
        backend: Backend,
        writeback: WriteBack,
        *,
        until_idle: bool,
    ) -> None:
        """The named tasks, from the start until the shutdown is done."""
        assert self._stop is not None
        side_stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:

            def start(name: str, work: Awaitable[None], *, task: str | None = None) -> Task:
                return group.create_task(self._guard(name, work), name=task)

            executors: list[Task] = []
            # How often a pump looks for cancels of its running copies: often where nothing
            # announces them, rarely (a safety net for a lost notification) where they are.
            announced = self._listen and getattr(backend, "supports_notify", False)
            cancel_poll = CANCEL_SAFETY_POLL if announced else CANCEL_POLL
            for pump in self._pumps.values():
                start(f"fetch {pump.name}", pump.fetch(self._stop))
                start(f"leases {pump.name}", pump.keep_leases(side_stop))
                start(f"cancels {pump.name}", pump.watch_cancels(side_stop, interval=cancel_poll))
                for index in range(pump.spec.concurrency):
                    slot = f"sqlbroker {pump.name} #{index}"
                    executors.append(
                        start(f"handler {pump.name}", pump.execute(self._stop), task=slot)
                    )
            if self._listen:
                start("listener", self._hints(backend))
            flusher = start("write-back", writeback.run(side_stop))
            start("reaper", self._reap(backend, side_stop))
            host, pid = socket.gethostname(), os.getpid()
            beat = WorkerBeat(name=self.name, host=host, pid=pid, subscriptions=tuple(self._pumps))
            interval = self._heartbeat_interval
            heartbeat = run_heartbeat(backend, self.recorder, beat, side_stop, interval=interval)
            start("heartbeat", heartbeat)
            if self._schedules:

                def run_due() -> Awaitable[ScheduleRun]:
                    return drive_async(backend, scheduling.run_due_schedules(self._broker))

                scheduler = Scheduler(poll_interval=self._poll_max)
                start("scheduler", scheduler.run(self._stop, run_due))
            if until_idle:
                start("idle watch", self._watch_idle(backend, writeback))
            group.create_task(self._shutdown(executors, writeback, flusher, side_stop))

    async def _hints(self, backend: Backend) -> None:
        """The backend's hints until the stop: after it, no pump claims any more."""
        assert self._stop is not None
        listener = asyncio.ensure_future(
            backend.listen_async(on_hint=self._hint, on_cancel=self._cancel_hint)
        )
        try:
            await wait_any(self._stop, futures=[listener])
        finally:
            listener.cancel()
            await asyncio.wait([listener])
        if not listener.cancelled():
            listener.result()  # it ended on its own: raises why

    def _cancel_hint(self, subscription: str) -> None:
        pump = self._pumps.get(subscription)
        if pump is not None:
            pump.cancel_hint()

    async def _ensure_subscriptions(self, backend: Backend) -> None:
        for spec in self._specs:
            if spec.is_queue:
                await backend.async_ops.subscription_ensure(name=spec.name)
            else:
                patterns = list(spec.patterns)
                subscribe = publishing.subscribe(self._broker, spec.name, patterns, replace=True)
                await drive_async(backend, subscribe)
            if spec.flow is not None:
                await backend.async_ops.flow_set(name=spec.name, limits=spec.flow)

    async def _guard(self, name: str, work: Awaitable[None]) -> None:
        try:
            await work
        except BaseException as error:
            task = asyncio.current_task()
            if isinstance(error, asyncio.CancelledError) and (task is None or task.cancelling()):
                raise
            # Also a cancellation not ours: a TaskGroup would drop the task without a word.
            log.exception("the worker's %s task died", name)
            if self._crash is None:
                self._crash = (name, error)
            assert self._stop is not None
            self._stop.set()

    async def _shutdown(
        self,
        executors: list[Task],
        writeback: WriteBack,
        flusher: Task,
        side_stop: asyncio.Event,
    ) -> None:
        assert self._stop is not None
        assert self._hard is not None
        await self._stop.wait()
        for pump in self._pumps.values():
            pump.stop_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace
        if not all(task.done() for task in executors):
            finished = asyncio.ensure_future(asyncio.wait(executors))
            await wait_any(self._hard, futures=[finished], timeout=deadline - loop.time())
            finished.cancel()  # the wait, not the handlers
        pending = [task for task in executors if not task.done()]
        if pending:
            log.warning("cancelling %d running handler(s)", len(pending))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        released = sum([await pump.release_unstarted() for pump in self._pumps.values()])
        if released:
            log.info("released %d claimed but unstarted message(s)", released)
        await self._wait_manual_acks(deadline)
        try:
            await writeback.drain(timeout=10.0)
        except Exception as error:
            # Database errors are retried inside the drain; this is a broken backend or a
            # bug. The outcomes not written come back when their leases expire.
            log.exception("the final write-back failed")
            if self._crash is None:
                self._crash = ("write-back", error)
        finally:
            side_stop.set()
        # The write-back task's last flush may still report, and so start hooks.
        await asyncio.wait([flusher])
        hooks = [task for pump in self._pumps.values() for task in pump.background]
        if hooks:
            await asyncio.wait(hooks, timeout=5.0)
        log.info("worker %s stopped", self.name)

    async def _wait_manual_acks(self, deadline: float) -> None:
        """Within the grace period, wait for the outcomes of started deliveries that the
        handlers left to a manual ``ack`` (from any thread). Those still open after it
        come back when their leases expire; a later ``ack`` raises."""
        assert self._hard is not None
        loop = asyncio.get_running_loop()
        open_pumps = [pump for pump in self._pumps.values() if pump.open]
        if not open_pumps:
            return
        count = sum(pump.open for pump in open_pumps)
        if not self._hard.is_set() and loop.time() < deadline:
            log.info("waiting for %d message(s) still to be settled by hand", count)
            settled = asyncio.ensure_future(
                asyncio.gather(*(pump.settled() for pump in open_pumps))
            )
            await wait_any(self._hard, futures=[settled], timeout=deadline - loop.time())
            settled.cancel()
            count = sum(pump.open for pump in open_pumps)
        if count:
            log.warning(
                "%d message(s) were not settled within the grace period; they will be"
                " delivered again when their leases expire",
                count,
            )

    def _flushed(self, report: FlushReport) -> None:
        if self._written is not None:
            self._written.set()
        for settlements, lost in ((report.done, False), (report.lost, True)):
            if settlements and lost:
                self._observers.outcomes_lost(settlements)
            elif settlements:
                self._observers.outcomes_written(settlements)
            for settlement in settlements:
                delivery = settlement.delivery
                if delivery is not None:  # always: the worker settles deliveries
                    self._pumps[delivery.subscription].flushed(settlement, delivery, lost=lost)

    async def _reap(self, backend: Backend, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                counts = await drive_async(backend, inspection.reap(self._broker))
            except SqlbrokerError as error:
                log.warning("reaper pass failed: %s", error)
            else:
                if counts.get("dead"):
                    log.warning(
                        "reaper dead-lettered %d message(s) whose worker was lost", counts["dead"]
                    )
                if counts.get("released") or counts.get("expired"):
                    log.info("reaper: %s", counts)
            await wait_any(stop, timeout=self._reap_interval * random.uniform(0.8, 1.2))

    async def _watch_idle(self, backend: Backend, writeback: WriteBack) -> None:
        """Stop once every pump is idle, nothing waits to be written and the database
        has nothing left for the subscriptions. Looked at every tenth of a second, and at
        once when a write-back lands (the last outcomes of a drain): a drain ends a write
        and one query after its last handler, not a poll or two later. The database is
        asked at most once per look, and after a "not yet" not again within 0.1 s."""
        assert self._stop is not None
        names = set(self._pumps)
        written = self._written = asyncio.Event()
        while not self._stop.is_set():
            await wait_any(self._stop, written, timeout=0.1)
            written.clear()
            if any(pump.busy or not pump.idle for pump in self._pumps.values()) or len(writeback):
                continue
            try:
                # The gauges alone: rates and handler times would cost queries for nothing.
                stats = await backend.async_ops.stats_collect()
            except SqlbrokerError:
                await wait_any(self._stop, timeout=0.1)
                continue
            remaining = sum(
                s.ready + s.scheduled + s.running for s in stats if s.subscription in names
            )
            if remaining == 0:
                self._request_stop(False)
            else:
                await wait_any(self._stop, timeout=0.1)
