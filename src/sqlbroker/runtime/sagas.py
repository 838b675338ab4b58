"""Saga steps as ordinary subscribers: the handler wrapped around a step's action or
compensation.

The wrapper reads the saga, runs the user's function, and then records the outcome *in
the message's own transaction* (``msg.transaction()``): the saga's transition, the next
message (through the same connection) and the ack commit together, so a step advances the
saga exactly once however often its message is delivered. The user's function itself runs
at least once per transition — a worker killed after it ran and before the commit runs it
again — so an effect outside the database guards itself with
``broker.once(f"{saga}.{step}", saga_id)``, or, declared ``transactional=True``, writes
through ``ctx.conn`` inside that very transaction and happens exactly once.

A failure is retried by the step's retry policy like any handler's; on the attempt the
policy would dead-letter, the wrapper turns the saga back instead (an action) — in the
message's transaction, so the action message is acked — or marks the saga ``failed`` and
lets the message be dead-lettered for a person (a compensation). An output that breaks the
payload rules (not JSON, a NUL, over the size limit) is refused before any SQL on both
backends and fails the step at once: another attempt would return the same value.

A plain step function makes the wrapper a plain handler: the worker runs it — the saga's
bookkeeping with it — on its handler threads under the step's timeout, like any plain
handler, so a step's ``concurrency`` is what runs at once. A coroutine runs on the loop, and
the bookkeeping around it on those handler threads (never on asyncio's default executor,
which is user code's and smaller than a step's concurrency may be).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlbroker.core.errors import InvalidOption, InvalidPayload, LeaseLost, SqlbrokerError
from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.sagas import SagaInstance, Step
from sqlbroker.features.sagas import Sagas
from sqlbroker.features.subscribers import is_async_callable
from sqlbroker.runtime.message import Message
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.seam import Tx

log = logging.getLogger("sqlbroker.sagas")

StepFunction = Callable[["StepContext"], Any]


class BadOutput(InvalidPayload):
    """An action returned a value the saga cannot store: the step fails at once."""


class DamagedSaga(SqlbrokerError):
    """The saga's stored row does not decode (``SagaInstance.damaged``): the step fails at
    once rather than run on stand-in data."""


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step's action or compensation sees.

    ``data`` is the saga's start data, ``outputs`` the outputs of the steps whose action
    completed (by step name; a compensation sees its own step's output there), ``attempt``
    counts this message's deliveries, and ``conn`` is the transaction's driver connection
    for ``transactional=True`` functions (``None`` otherwise).
    """

    saga_id: str
    saga: str
    step: str
    data: Any
    outputs: dict[str, Any]
    attempt: int
    compensating: bool
    conn: CallerConnection | None = None


def saga_handler(
    sagas: Callable[[], Sagas],
    step: Step,
    function: StepFunction,
    *,
    undo: bool,
    transactional: bool,
    retry: RetryPolicy,
) -> Callable[[Message], Any]:
    """The subscriber handler for ``step``'s action (or, with ``undo``, its compensation)."""
    if not callable(function):
        raise InvalidOption("handler", "must be a function or other callable")
    if transactional and is_async_callable(function):
        raise InvalidOption(
            "transactional", "a transactional step is a plain function (it runs in a thread)"
        )
    runner = _StepRunner(sagas, step, function, undo, transactional, retry)
    return runner.handle_async if is_async_callable(function) else runner.handle


@dataclass(frozen=True, slots=True)
class _StepRunner:
    _sagas: Callable[[], Sagas]
    _step: Step
    _function: StepFunction
    _undo: bool
    _transactional: bool
    _retry: RetryPolicy

    def _context(self, state: SagaInstance, msg: Message, conn: object = None) -> StepContext:
        if state.damaged is not None:
            raise DamagedSaga(f"saga {state.id} does not decode: {state.damaged}")
        return StepContext(
            saga_id=state.id,
            saga=state.name,
            step=self._step.name,
            data=state.data,
            outputs=state.outputs(),
            attempt=msg.attempt,
            compensating=self._undo,
            conn=conn,
        )

    def _output(self, output: Any) -> str | None:
        """The action's output as JSON text; a compensation's return value is not kept.

        An output that breaks the payload rules fails the step for good (``BadOutput``):
        another attempt would repeat the action's effect only to return the same value."""
        if self._undo:
            return None
        try:
            return self._sagas().encode(output, "output")
        except InvalidPayload as error:
            raise BadOutput(error.field, f"cannot be stored: {error.problem}") from None

    def _due(self, msg: Message) -> SagaInstance | None:
        """The saga whose step ``msg`` is to run (the step at ``state.step``); ``None`` when
        it is not (not a step message, stale, or an action the saga turned back from before
        it ran: recorded as skipped here)."""
        payload = msg.payload if isinstance(msg.payload, dict) else {}
        saga_id, index = payload.get("saga_id"), payload.get("step")
        if not isinstance(saga_id, str) or not isinstance(index, int):
            log.warning("%s: message %s is not a saga step; dropped", msg.subscription, msg.id)
            return None
        state = self._sagas().find(saga_id)
        verdict = Sagas.action_verdict(state, index, msg.id, undo=self._undo)
        if verdict == "skip":
            self._record(msg, "skip", saga_id, index, None)
        return state if verdict == "run" else None

    def handle(self, msg: Message) -> None:
        """A plain step function, on the worker's handler thread."""
        state = self._due(msg)
        if state is None:
            return
        try:
            if self._transactional:
                self._run_in_transaction(msg, state.id, state.step)
                return
            text = self._output(self._function(self._context(state, msg)))
        except LeaseLost:
            raise
        except Exception as error:
            self._failed(msg, state.id, state.step, error)
            return
        self._record(msg, "done", state.id, state.step, text)

    async def handle_async(self, msg: Message) -> None:
        """A coroutine step function, on the loop; the bookkeeping on handler threads."""
        state = await msg._off_loop(self._due, msg)
        if state is None:
            return
        try:
            text = self._output(await self._function(self._context(state, msg)))
        except LeaseLost:
            raise
        except Exception as error:
            await msg._off_loop(self._failed, msg, state.id, state.step, error)
            return
        await msg._off_loop(self._record, msg, "done", state.id, state.step, text)

    def _run_in_transaction(self, msg: Message, saga_id: str, index: int) -> None:
        sagas = self._sagas()
        with msg.transaction() as conn:
            # The caller's connection adapted into the seam's Tx for our statements; the
            # step function runs outside those savepoints, on ``conn`` itself.
            with sagas.backend.begin(conn) as tx:
                state = tx.saga_get(id=saga_id, lock=True)
                verdict = Sagas.action_verdict(state, index, msg.id, undo=self._undo)
                if verdict == "skip":  # turned back since it was read: the action never runs
                    self._transition(tx, msg, "skip", saga_id, index, None)
            if verdict != "run":
                return
            assert state is not None
            output = self._output(self._function(self._context(state, msg, conn)))
            with sagas.backend.begin(conn) as tx:
                self._transition(tx, msg, "done", saga_id, index, output)

    def _record(
        self, msg: Message, outcome: str, saga_id: str, index: int, detail: str | None
    ) -> None:
        with msg.transaction() as conn, self._sagas().backend.begin(conn) as tx:
            self._transition(tx, msg, outcome, saga_id, index, detail)

    def _transition(
        self, tx: Tx, msg: Message, outcome: str, saga_id: str, index: int, detail: str | None
    ) -> None:
        sagas = self._sagas()
        if outcome == "skip":
            sagas.action_skipped(tx, saga_id, index, msg.id)
        elif outcome == "done" and self._undo:
            sagas.undo_done(tx, saga_id, index, msg.id, msg.attempt)
        elif outcome == "done":
            sagas.action_done(tx, saga_id, index, msg.id, detail or "null", msg.attempt)
        else:
            sagas.action_failed(tx, saga_id, index, msg.id, detail or "failed", msg.attempt)

    def _failed(self, msg: Message, saga_id: str, index: int, error: Exception) -> None:
        """After the attempt that failed with ``error``: raise it for the retry policy's
        next attempt, or, on the attempt it would dead-letter, turn the saga back (an
        action: the message is acked with the transition) or mark it failed and raise (a
        compensation: the message goes to the dead letters)."""
        if isinstance(error, BadOutput | DamagedSaga):
            reason = str(error)
        else:
            settlement = self._retry.decide(msg.delivery, error)
            if settlement.kind != "dead":
                raise error
            reason = settlement.reason
        if str(error) != reason:
            reason = f"{reason} ({type(error).__name__}: {error})"
        if not self._undo:
            log.warning("saga %s: step %s failed for good: %s", saga_id, self._step.name, reason)
            self._record(msg, "failed", saga_id, index, reason)
            return
        # The saga is marked failed in a transaction of its own; the message then goes to the
        # dead letters through the usual write-back. A crash in between redelivers it and
        # the compensation simply runs once more.
        self._sagas().compensation_failed(saga_id, index, msg.id, reason, msg.attempt)
        raise error
