"""What a pump holds, the state its tasks share: the deliveries it claimed (buffered,
running, or settled and not yet written back), the slots they take and the leases kept
alive for them, and how each leaves: settled, forgotten once written, lost, or released."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.core.message import Delivery
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.features.subscribers import SubscriberSpec
from sqlbroker.runtime.events import WorkerObserver
from sqlbroker.runtime.handling import report_dead_letter
from sqlbroker.runtime.message import Message
from sqlbroker.runtime.writeback import WriteBack, wait_any
from sqlbroker.storage.backend import Backend

log = logging.getLogger("sqlbroker.runtime")


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Holding:
    """The base of :class:`~sqlbroker.runtime.pump.Pump`: its state, and the lease keeper."""

    def __init__(
        self,
        *,
        backend: Backend,
        spec: SubscriberSpec,
        lease: float,
        worker_name: str,
        writeback: WriteBack,
        handler_threads: Executor,
        poll_max: float,
        observer: WorkerObserver,
        result_limit: int,
    ) -> None:
        self.spec = spec
        self._result_limit = result_limit
        self._observer = observer
        self._backend = backend
        self._lease = spec.lease or lease
        self._worker_name = worker_name
        self._writeback = writeback
        self._threads = handler_threads
        self._poll_min = min(0.05, poll_max)
        self._poll_max = poll_max
        # Claimed deliveries waiting for a handler slot, and the idle slots waiting for
        # one: a deque and a future per wait, about a tenth of asyncio.Queue's cost.
        self._buffer: deque[Delivery] = deque()
        self._idle_slots: deque[asyncio.Future[None]] = deque()
        self._open: set[tuple[int, str]] = set()  # claimed, no outcome yet (Lease's tuples)
        self._held: dict[int, Delivery] = {}  # by copy: a new claim replaces a lost lease
        self._hinted = False
        self._hint_waiter: asyncio.Future[None] | None = None
        self._slot_waiter: asyncio.Future[None] | None = None
        self._capacity = asyncio.Event()
        # The last claim found fewer copies than it asked for (none left, for all it
        # knows): with nothing open the pump is idle, the worker's stats say for sure.
        self._drained = False
        self._pace: float | None = None  # recent handler seconds (moving average)
        # Whether the last claim went through the subscription's flow limits: then copies
        # claimed ahead of free slots would hold the caps' slots idle in the buffer.
        self._flow_limited = False
        # By copy: the handlers in progress, and the task that runs each.
        self._running: dict[int, tuple[Message, asyncio.Task[Any] | None]] = {}
        self._cancelled_tasks: set[int] = set()  # copies whose handler task we cancelled
        self._cancels = asyncio.Event()  # a cancel was announced for this subscription
        self.background: set[asyncio.Task[Any]] = set()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def busy(self) -> bool:
        return bool(self._held)

    @property
    def idle(self) -> bool:
        """The last claim came back short and every copy it claimed has its outcome: as
        soon as that is written, ``run_until_idle`` may ask the database whether any is
        left, without a further claim that finds nothing."""
        return self._drained and not self._open

    @property
    def open(self) -> int:
        """How many claimed deliveries have no outcome yet."""
        return len(self._open)

    def _settle(self, settlement: Settlement) -> None:
        self._writeback.add(settlement)
        self._free_slot(settlement.lease)

    def _free_slot(self, lease: tuple[int, str]) -> None:
        self._open.discard(lease)
        self._capacity.set()
        if self._slot_waiter is not None:
            _resolve(self._slot_waiter)
        if self._drained and not self._open:
            # The last claim took all there was and it is settled: nothing will join
            # these outcomes in the write-back's window.
            self._writeback.hurry()
        # A copy settled in its own transaction frees the backlog's room without a write:
        # another subscription's pump may be waiting for it.
        self._writeback.roomy.set()

    def _forget(self, lease: Lease) -> None:
        """Stop extending ``lease`` — unless its copy was claimed again since."""
        held = self._held.get(lease.id)
        if held is not None and held.lease_token == lease.token:
            del self._held[lease.id]

    def flushed(self, settlement: Settlement, delivery: Delivery, *, lost: bool) -> None:
        """Called by the worker when ``settlement`` of ``delivery`` was written back (or its
        lease was lost)."""
        self._forget(settlement.lease)
        if lost:
            log.warning(
                "%s: the lease on delivery %d (message %s) was lost before its outcome was"
                " written; another consumer has it now",
                self.name,
                delivery.id,
                delivery.message_id,
            )
            return
        if settlement.kind == "dead":
            report_dead_letter(
                self.spec, delivery, settlement.reason, self._threads, self.background
            )

    async def settled(self) -> None:
        """Return once every claimed delivery has its outcome: after the stop, the ones
        still open are those a manual ``ack`` may yet settle, from any thread."""
        while self._open:
            self._capacity.clear()
            await self._capacity.wait()

    async def keep_leases(self, stop: asyncio.Event) -> None:
        """Extend every held lease each third of the lease, until ``stop``."""
        interval = max(0.05, self._lease / 3)
        while not stop.is_set():
            await wait_any(stop, timeout=interval)
            held = list(self._held.values())
            if not held:
                continue
            try:
                extended = await self._backend.async_ops.message_extend_leases(
                    leases=[Lease.of(d) for d in held],
                    lease=self._lease,
                )
            except SqlbrokerError as error:
                log.warning("extending %d leases on %s failed: %s", len(held), self.name, error)
                continue
            lost = {
                Lease.of(d): d
                for d in held
                if d.id not in extended and Lease.of(d) in self._open and self._held.get(d.id) is d
            }
            if lost:
                self._lost(lost)

    def _lost(self, lost: dict[Lease, Delivery]) -> None:
        """Another consumer may have these copies now: those still waiting for a handler
        are dropped, and no lease of them is extended any more (nothing can renew it)."""
        unstarted = {Lease.of(item) for item in self._unqueue(lambda item: Lease.of(item) in lost)}
        for lease, delivery in lost.items():
            self._forget(lease)
            if lease in unstarted:
                self._free_slot(lease)
            log.warning(
                "%s: lost the lease on delivery %d (message %s) %s",
                self.name,
                delivery.id,
                delivery.message_id,
                "before it started; it is not run here"
                if lease in unstarted
                else "while it was in progress; it may be delivered again",
            )

    async def release_unstarted(self) -> int:
        """Give back claimed deliveries no handler started; returns how many."""
        return await self._release(self._unqueue(lambda _: True))

    def _unqueue(self, wanted: Callable[[Delivery], bool]) -> list[Delivery]:
        """Take the buffered deliveries ``wanted`` picks out of the buffer; the rest stay,
        in their order."""
        taken: list[Delivery] = []
        kept: deque[Delivery] = deque()
        for item in self._buffer:
            (taken if wanted(item) else kept).append(item)
        self._buffer = kept
        return taken

    async def _release(self, unstarted: list[Delivery]) -> int:
        if not unstarted:
            return 0
        try:
            await self._backend.async_ops.message_release_many(
                leases=[Lease.of(d) for d in unstarted]
            )
        except SqlbrokerError as error:
            log.warning(
                "could not release %d unstarted messages of %s (%s); they return when their"
                " lease expires",
                len(unstarted),
                self.name,
                error,
            )
        for lease in map(Lease.of, unstarted):
            self._free_slot(lease)
            self._forget(lease)
        return len(unstarted)
