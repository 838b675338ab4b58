"""The saga coordinator: start, advance, turn back, cancel and sweep, as transitions on the
saga tables.

Every transition runs in one transaction that first reads the saga under a lock
(``saga_get(lock=True)``), checks that the message causing it is still the one the saga
waits for (``message_id``, the step's index and status), then writes the new state, sends
the next message through the same connection (the outbox) and — in the runtime — acks the
causing message. A transition therefore happens exactly once however often its message is
delivered: a redelivery after a commit finds the saga moved on and does nothing.

The state machine:

- ``running`` at step *k*: step *k*'s action message is out. Done → step *k+1* (or
  ``completed``); failed for good → step *k* ``failed`` and the saga turns back.
- turning back from *k*: the highest step below or at *k* that is ``done`` and compensates
  gets its compensation message (``compensating``); when none is left, ``compensated``.
- a compensation done → its step ``compensated``, turn back from the step below it; failed
  for good → ``compensation_failed`` and the saga ``failed`` (its message is dead-lettered
  for a person; replaying it runs the compensation again and, if it succeeds, resumes).
- ``cancel`` or the saga's deadline switches a ``running`` saga to ``compensating`` while
  step *k*'s action is still out; that message then decides: if the action had not started
  it is ``cancelled``, if it completes it is ``done`` and compensated first. So a step that
  completes after its saga turned back is still compensated, in reverse order.
- the sweeper (``sweep``, run by every worker's reaper) handles what no handler will: the
  awaited message was dead-lettered (the reaper gave up on a worker that kept dying, or a
  timeout on the last attempt), or a deadline passed.
"""

from __future__ import annotations

import json
import logging
import uuid
import warnings
from collections.abc import Callable, Collection
from decimal import Decimal
from typing import Any

from sqlbroker.core import observability, validate
from sqlbroker.core.errors import InvalidOption, NotFound, SqlbrokerError
from sqlbroker.core.sagas import (
    NewSaga,
    Saga,
    SagaConflict,
    SagaInstance,
    SagaStatus,
    SagaStep,
    SagaWarning,
    StepStatus,
    saga_queue,
)
from sqlbroker.core.serde import encode_value
from sqlbroker.features.publishing import PublishDefaults, build_message
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.seam import Tx

log = logging.getLogger("sqlbroker.sagas")

MAX_LIST = 10_000
_VERDICTS = {
    # (a compensation's message?, the saga's status, the step's status): the verdict
    (False, SagaStatus.RUNNING, StepStatus.RUNNING): "run",
    (False, SagaStatus.COMPENSATING, StepStatus.RUNNING): "skip",
    (True, SagaStatus.COMPENSATING, StepStatus.COMPENSATING): "run",
    (True, SagaStatus.FAILED, StepStatus.COMPENSATION_FAILED): "run",
}


class SagaMoved(SqlbrokerError):
    """A saga changed under a transition that held its lock (a bug, or a lock not held)."""


WORKER_AGE = 60.0
"""Seconds since its last heartbeat within which a worker counts as serving its queues."""


def warn_unhandled(
    backend: Backend, saga: Saga, handled: Collection[str], *, when: str
) -> list[str]:
    """Warn (a log warning and a :class:`SagaWarning`) when queues of ``saga`` have no
    handler: none in ``handled`` (this process's) nor in any live worker's subscriptions.
    Returns those queues. Handlers may live in another process, so this never refuses."""
    missing = [queue for queue in saga.queues() if queue not in handled]
    if missing:
        try:
            workers = observability.alive(backend.worker_list(), max_age=WORKER_AGE)
        except SqlbrokerError as error:  # a check, not the caller's operation
            log.debug("could not read the workers to check saga %s: %s", saga.name, error)
            return []
        serving = {queue for worker in workers for queue in worker.subscriptions}
        missing = [queue for queue in missing if queue not in serving]
    if missing:
        text = (
            f"{when} saga {saga.name!r}, but no handler in this process or any live worker"
            f" serves {', '.join(missing)}: its sagas wait at those steps until one runs"
            " (register them with @broker.saga_step / @broker.saga_compensation)"
        )
        log.warning(text, extra={"saga": saga.name, "queues": missing})
        warnings.warn(text, SagaWarning, stacklevel=3)
    return missing


class Sagas:
    """Sagas through one backend: ``broker.sagas``. See the module docstring.

    ``handled`` names the queues this process has handlers for; the first :meth:`start` of
    each saga (tracked in ``checked``, shared by the broker) warns of steps no handler
    serves, here or in a live worker (:func:`warn_unhandled`)."""

    def __init__(
        self,
        ready: Callable[[], Backend],
        defaults: PublishDefaults,
        *,
        handled: Callable[[], Collection[str]],
        checked: set[str],
    ) -> None:
        self._ready = ready
        self._defaults = defaults
        self._handled = handled
        self._checked = checked

    # --- the public API ----------------------------------------------------------------------

    def encode(self, value: Any, field: str) -> str:
        """``value`` as JSON text for the saga tables, checked by the payload rules before
        any SQL runs (plain JSON, no NaN, no NUL or lone surrogate, at most the broker's
        ``payload_limit`` bytes), or :class:`InvalidPayload` naming ``field``: saga data
        and step outputs are stored as ``jsonb`` on PostgreSQL, which refuses a NUL."""
        return encode_value(value, limit=self._defaults.payload_limit, field=field).decode("utf-8")

    def start(
        self,
        saga: Saga,
        data: Any = None,
        *,
        saga_id: str | None = None,
        conn: CallerConnection | None = None,
    ) -> str:
        """Start ``saga`` with ``data`` (JSON) and return its id.

        Idempotent on ``saga_id``: starting the same saga with equal data again returns
        the id and writes nothing; different data (or another saga's id) raises
        :class:`SagaConflict`. Data is compared as JSON values, the same on both
        backends: key order does not matter, numbers compare by value (``2`` equals
        ``2.0``), and ``true`` is not ``1``. ``data`` follows the payload rules
        (:meth:`encode`). With ``conn`` the saga and its first message are written in the
        caller's transaction and exist only if the caller commits.
        """
        if not isinstance(saga, Saga):
            raise InvalidOption("saga", "must be a Saga")
        new = NewSaga(
            id=validate.key(saga_id, "saga_id") or str(uuid.uuid4()),
            name=saga.name,
            data=self.encode(data, "data"),
            steps=tuple((step.name, step.compensate) for step in saga.steps),
            timeout=saga.timeout,
        )
        if saga.name not in self._checked:
            self._checked.add(saga.name)
            warn_unhandled(self.backend, saga, self._handled(), when="started")
        with self.backend.begin(conn) as tx:  # the caller's connection, adapted once
            if tx.saga_insert(saga=new):
                self._send(tx, new, saga.steps[0].name, 0)
                return new.id
            found = tx.saga_get(id=new.id, steps=False)
            if found is None:  # deleted between the two statements: not ours to recreate
                raise SagaConflict(new.id, "and removed meanwhile")
            if found.name != saga.name:
                raise SagaConflict(new.id, f"for saga {found.name!r}")
            if not _same_json(found.data, json.loads(new.data)):
                raise SagaConflict(new.id, "with different data")
        return new.id

    @property
    def backend(self) -> Backend:
        """The broker's backend, its schema checked (and migrated, if the broker was told
        to) as before every operation; its ``begin(conn)`` adapts a caller's connection
        into the ``Tx`` the transitions below run in."""
        return self._ready()

    def get(self, saga_id: str) -> SagaInstance:
        """The saga with its steps; ``NotFound`` when there is none."""
        found = self.backend.saga_get(id=validate.required_key(saga_id, "saga_id"))
        if found is None:
            raise NotFound(f"no saga {saga_id!r}")
        return found

    def list(
        self, *, name: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[SagaInstance]:
        """Sagas, newest first (without their steps), of saga ``name`` and ``status``."""
        if status is not None:
            status = validate.member(status, SagaStatus, "status").value
        count = validate.integer(limit, "limit", minimum=1, maximum=MAX_LIST)
        return self.backend.saga_list(name=name, status=status, limit=count)

    def counts(self) -> dict[str, int]:
        """How many sagas there are in each status."""
        return self.backend.saga_counts()

    def cancel(self, saga_id: str, *, reason: str = "cancelled") -> bool:
        """Turn a running saga back: what is done gets compensated (the step in flight
        finishes or is skipped first). False when it is not running (any more)."""
        text = validate.reason(reason)
        with self.backend.begin() as tx:
            saga = tx.saga_get(id=validate.required_key(saga_id, "saga_id"), lock=True)
            if saga is None:
                raise NotFound(f"no saga {saga_id!r}")
            if saga.status != SagaStatus.RUNNING:
                return False
            self._switch(tx, saga, SagaStatus.COMPENSATING, text)
            return True

    # --- transitions driven by step messages (inside the message's transaction) ------------

    def find(self, saga_id: str) -> SagaInstance | None:
        """The saga with its steps, or ``None``."""
        return self.backend.saga_get(id=saga_id)

    def compensation_failed(
        self, saga_id: str, index: int, message_id: str, reason: str, attempt: int
    ) -> bool:
        """Record the compensation of step ``index`` failed for good, in a transaction of
        its own: the saga ``failed`` (the message is dead-lettered separately, by the
        runtime's write-back). False if the message was stale and nothing changed."""
        with self.backend.begin() as tx:
            saga = tx.saga_get(id=saga_id, lock=True)
            if saga is None or self.action_verdict(saga, index, message_id, undo=True) != "run":
                return False
            self._fail_undo(tx, saga, reason, attempt)
            return True

    @staticmethod
    def action_verdict(
        saga: SagaInstance | None, index: int, message_id: str, *, undo: bool = False
    ) -> str:
        """What a step's action message (``undo``: its compensation's) should do: ``"run"``
        its function, ``"skip"`` it (an action the saga turned back from before it started)
        or ``"stale"`` (it is no longer awaited: ack it). A saga ``failed`` on this very
        compensation runs it again: that is a person replaying its dead letter."""
        if (
            saga is None
            or saga.message_id != message_id
            or saga.step != index
            or index >= len(saga.steps)
        ):
            return "stale"
        return _VERDICTS.get((undo, saga.status, saga.steps[index].status), "stale")

    def action_done(
        self, tx: Tx, saga_id: str, index: int, message_id: str, output: str, attempt: int
    ) -> bool:
        """Record step ``index`` done with ``output`` (JSON text) and move on; False if the
        message was stale and nothing changed."""
        saga = tx.saga_get(id=saga_id, lock=True)
        if saga is None or self.action_verdict(saga, index, message_id) not in ("run", "skip"):
            return False
        tx.saga_step_update(
            saga_id=saga_id,
            index=index,
            status=StepStatus.DONE,
            attempts=attempt,
            output=output,
        )
        if saga.status == SagaStatus.COMPENSATING:
            self._turn_back(tx, self._relock(tx, saga_id), index, saga.error)
            return True
        if index + 1 < len(saga.steps):
            self._send(tx, saga, saga.steps[index + 1].name, index + 1)
        else:
            self._update(tx, saga, SagaStatus.COMPLETED, index, None, None)
        return True

    def action_failed(
        self, tx: Tx, saga_id: str, index: int, message_id: str, reason: str, attempt: int
    ) -> bool:
        """Record step ``index`` failed for good and turn the saga back."""
        saga = tx.saga_get(id=saga_id, lock=True)
        if saga is None or self.action_verdict(saga, index, message_id) not in ("run", "skip"):
            return False
        self._fail_step(tx, saga, reason, attempt)
        return True

    def action_skipped(self, tx: Tx, saga_id: str, index: int, message_id: str) -> bool:
        """The saga turned back before step ``index``'s action ran: it never will."""
        saga = tx.saga_get(id=saga_id, lock=True)
        if saga is None or self.action_verdict(saga, index, message_id) != "skip":
            return False
        tx.saga_step_update(saga_id=saga_id, index=index, status=StepStatus.CANCELLED)
        self._turn_back(tx, self._relock(tx, saga_id), index - 1, saga.error)
        return True

    def undo_done(self, tx: Tx, saga_id: str, index: int, message_id: str, attempt: int) -> bool:
        """Record step ``index`` compensated and turn back to the step below."""
        saga = tx.saga_get(id=saga_id, lock=True)
        if saga is None or self.action_verdict(saga, index, message_id, undo=True) != "run":
            return False
        tx.saga_step_update(
            saga_id=saga_id, index=index, status=StepStatus.COMPENSATED, attempts=attempt
        )
        self._turn_back(tx, self._relock(tx, saga_id), index - 1, saga.error)
        return True

    # --- the sweeper ---------------------------------------------------------------------------

    def sweep(self, *, limit: int = 1000) -> int:
        """Move on the sagas no handler will: the awaited message was dead-lettered (a step
        fails, a compensation fails the saga), or the deadline passed (a running saga turns
        back; a compensating one is marked ``failed``). Returns how many moved."""
        moved = 0
        for due in self.backend.saga_due(limit=limit):
            try:
                with self.backend.begin() as tx:
                    saga = tx.saga_get(id=due.id, lock=True)
                    if saga is None or saga.version != due.version or saga.status.terminal:
                        continue
                    self._sweep_one(tx, saga, due.dead_reason, due.expired)
                    moved += 1
            except SqlbrokerError as error:
                log.warning("sweeping saga %s failed: %s", due.id, error)
        return moved

    def _sweep_one(
        self, tx: Tx, saga: SagaInstance, dead_reason: str | None, expired: bool
    ) -> None:
        step = saga.steps[saga.step]
        if dead_reason is not None:
            why = f"its message was dead-lettered: {dead_reason}"
            if step.status == StepStatus.RUNNING:
                self._fail_step(tx, saga, why, step.attempts)
                return
            if step.status == StepStatus.COMPENSATING:
                self._fail_undo(tx, saga, why, step.attempts)
                return
        if expired and saga.status == SagaStatus.RUNNING:
            log.warning("saga %s (%s) timed out at step %s", saga.id, saga.name, step.name)
            self._switch(tx, saga, SagaStatus.COMPENSATING, f"timed out at step {step.name}")
        elif expired:
            log.error("saga %s (%s): compensations timed out", saga.id, saga.name)
            error = f"compensations timed out at step {step.name} (after: {saga.error})"
            self._switch(tx, saga, SagaStatus.FAILED, error)

    # --- shared moves ------------------------------------------------------------------------

    def _switch(self, tx: Tx, saga: SagaInstance, status: SagaStatus, error: str) -> None:
        """Move ``saga`` to ``status`` where it stands (its step, the message it awaits):
        turned back while its step's action is out (``compensating``, a fresh deadline),
        or ``failed``."""
        restart = status == SagaStatus.COMPENSATING
        self._update(tx, saga, status, saga.step, error, saga.message_id, restart=restart)

    def _step_failed(
        self, tx: Tx, saga: SagaInstance, status: StepStatus, reason: str, attempt: int
    ) -> SagaStep:
        """Mark the step the saga stands at ``status`` (failed, or its compensation failed)."""
        step = saga.steps[saga.step]
        tx.saga_step_update(
            saga_id=saga.id, index=step.index, status=status, attempts=attempt, error=reason
        )
        return step

    def _fail_step(self, tx: Tx, saga: SagaInstance, reason: str, attempt: int) -> None:
        step = self._step_failed(tx, saga, StepStatus.FAILED, reason, attempt)
        error = saga.error or f"step {step.name} failed: {reason}"
        self._turn_back(tx, self._relock(tx, saga.id), step.index - 1, error)

    def _fail_undo(self, tx: Tx, saga: SagaInstance, reason: str, attempt: int) -> None:
        step = self._step_failed(tx, saga, StepStatus.COMPENSATION_FAILED, reason, attempt)
        error = f"compensation of step {step.name} failed: {reason}"
        log.error("saga %s (%s): the %s", saga.id, saga.name, error)
        self._switch(tx, saga, SagaStatus.FAILED, error)

    def _turn_back(self, tx: Tx, saga: SagaInstance, below: int, error: str | None) -> None:
        """Send the compensation of the highest compensating ``done`` step at or below
        ``below``; with none left, the saga is ``compensated``."""
        for step in reversed(saga.steps[: below + 1]):
            if step.status == StepStatus.DONE and step.compensate:
                restart = saga.status != SagaStatus.COMPENSATING
                self._send(tx, saga, step.name, step.index, undo=True, error=error, restart=restart)
                return
        self._update(tx, saga, SagaStatus.COMPENSATED, max(below, 0), error, None)

    def _relock(self, tx: Tx, saga_id: str) -> SagaInstance:
        saga = tx.saga_get(id=saga_id, lock=True)
        if saga is None:
            raise SagaMoved(f"saga {saga_id} vanished inside its own transaction")
        return saga

    def _update(
        self,
        tx: Tx,
        saga: SagaInstance | NewSaga,
        status: SagaStatus,
        step: int,
        error: str | None,
        message_id: str | None,
        *,
        restart: bool = False,
    ) -> None:
        """Compare-and-set ``saga`` from its version (a saga just inserted is at 1)."""
        if not tx.saga_update(
            id=saga.id,
            version=saga.version if isinstance(saga, SagaInstance) else 1,
            status=status,
            step=step,
            error=error,
            message_id=message_id,
            restart_deadline=restart,
        ):
            raise SagaMoved(f"saga {saga.id} moved on under a transition holding its lock")

    def _send(
        self,
        tx: Tx,
        saga: SagaInstance | NewSaga,
        step: str,
        index: int,
        *,
        undo: bool = False,
        error: str | None = None,
        restart: bool = False,
    ) -> None:
        """Send the message of step ``index``'s action (``undo``: its compensation), mark
        the step ``running`` (``compensating``) and the saga waiting for that message."""
        queue = saga_queue(saga.name, step, undo=undo)
        message = build_message(
            queue,
            {"saga_id": saga.id, "saga": saga.name, "step": index, "undo": undo},
            defaults=self._defaults,
        )
        sent = tx.message_insert_many(messages=[message], subscription=queue).message_ids[0]
        step_status = StepStatus.COMPENSATING if undo else StepStatus.RUNNING
        tx.saga_step_update(saga_id=saga.id, index=index, status=step_status)
        status = SagaStatus.COMPENSATING if undo else SagaStatus.RUNNING
        self._update(tx, saga, status, index, error, sent, restart=restart)


def _same_json(left: Any, right: Any) -> bool:
    """Whether two decoded JSON values are the same JSON: objects whatever their key
    order, arrays in order, strings exactly, ``true``/``false``/``null`` only as
    themselves, and numbers by their decimal value — ``2`` equals ``2.0``, and a float
    equals the integer PostgreSQL's ``jsonb`` gives back for it (``1e16`` is read back
    as ``10000000000000000``).

    A float counts as the shortest decimal that reads back as it (its ``repr``), which is
    the text stored on SQLite and the exact number ``jsonb`` keeps, so a stored value
    compares the same on both backends.
    """
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return _decimal(left) == _decimal(right)
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(
            _same_json(item, right[key]) for key, item in left.items()
        )
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_same_json, left, right))
    return type(left) is type(right) and bool(left == right)


def _decimal(number: int | float) -> Decimal:
    return Decimal(repr(number)) if isinstance(number, float) else Decimal(number)
