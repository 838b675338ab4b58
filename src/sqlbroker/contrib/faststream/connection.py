"""The database side of a :class:`~sqlbroker.contrib.faststream.SqlBroker`.

Publishing goes through a :class:`sqlbroker.AsyncBroker` (so ``conn=`` joins the caller's
transaction, sync or async driver alike); consuming is a :class:`sqlbroker.Worker` of a
:class:`sqlbroker.Broker` running the FastStream subscribers as ``ack="manual"`` sqlbroker
subscribers: the worker claims, keeps leases alive, writes the outcomes back in batches,
reaps expired leases and shuts down gracefully, exactly as for sqlbroker's own handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from sqlbroker import AsyncBroker, Broker, Worker
from sqlbroker.features.subscribers import SubscriberSpec


class WorkerRun:
    """One sqlbroker worker running some subscribers as a task on the running loop."""

    def __init__(
        self,
        broker: Broker,
        consumptions: Sequence[SubscriberSpec],
        worker_options: dict[str, Any],
        *,
        owns_broker: bool,
    ) -> None:
        self.names = [spec.name for spec in consumptions]
        broker.subscribers.update((spec.name, spec) for spec in consumptions)
        self.broker = broker
        self.worker: Worker = broker.worker(
            subscriptions=self.names,
            install_signal_handlers=False,
            schedules=False,
            **worker_options,
        )
        self._owns_broker = owns_broker
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self.worker.run_async())

    async def stop(self) -> None:
        """Stop gracefully: running handlers finish (within the worker's grace period),
        claimed-but-unstarted messages go back, outcomes are flushed."""
        self.worker.stop()
        if self._task is not None:
            task, self._task = self._task, None
            await asyncio.shield(task)
        for name in self.names:
            self.broker.subscribers.pop(name, None)
        if self._owns_broker:
            await asyncio.to_thread(self.broker.close)


class SqlConnection:
    """Owns the two sqlbroker faces of one FastStream broker and its running workers."""

    def __init__(self, url: str, options: dict[str, Any], worker_options: dict[str, Any]) -> None:
        self.url = url
        self.options = options
        self.worker_options = worker_options
        self.publisher = AsyncBroker(url, **options)
        try:
            self.consumer = Broker(url, **options)
        except BaseException:
            with contextlib.suppress(Exception):
                self.publisher.backend.close()
            raise
        self.runs: list[WorkerRun] = []

    async def declare(self, consumptions: Sequence[SubscriberSpec]) -> None:
        """Create the subscriptions now, so messages published before a worker first starts
        are routed to them rather than recorded as unrouted."""
        for item in consumptions:
            await self.publisher.subscribe(item.name, list(item.patterns))

    def run(self, consumptions: Sequence[SubscriberSpec], *, dedicated: bool) -> WorkerRun:
        """Start a worker for ``consumptions``: on the shared consumer broker, or (for a
        subscriber started while others run) on a broker of its own."""
        broker = Broker(self.url, **self.options) if dedicated else self.consumer
        run = WorkerRun(broker, consumptions, self.worker_options, owns_broker=dedicated)
        run.start()
        self.runs.append(run)
        return run

    async def stop_run(self, run: WorkerRun) -> None:
        if run in self.runs:
            self.runs.remove(run)
        await run.stop()

    def hint(self) -> None:
        """A publish committed: wake this process's workers now rather than at their poll."""
        for run in self.runs:
            run.worker.hint(None)

    async def close(self) -> None:
        for run in list(self.runs):
            await self.stop_run(run)
        await self.publisher.close()
        await asyncio.to_thread(self.consumer.close)
