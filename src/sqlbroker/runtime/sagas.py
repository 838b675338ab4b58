"""Saga steps as ordinary subscribers: the handler wrapped around a step's action or
compensation.

The wrapper reads the saga, runs the user's function (a plain function in a thread, a
coroutine on the loop), and then records the outcome *in the message's own transaction*
(``msg.transaction()``): the saga's transition, the next message (through the same
connection) and the ack commit together, so a step advances the saga exactly once however
often its message is delivered. The user's function itself runs at least once per
transition — a worker killed after it ran and before the commit runs it again — so an
effect outside the database guards itself with ``broker.once(f"{saga}.{step}", saga_id)``,
or, declared ``transactional=True``, writes through ``ctx.conn`` inside that very
transaction and happens exactly once.

A failure is retried by the step's retry policy like any handler's; on the attempt the
policy would dead-letter, the wrapper turns the saga back instead (an action) — in the
message's transaction, so the action message is acked — or marks the saga ``failed`` and
lets the message be dead-lettered for a person (a compensation).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlbroker.core.errors import InvalidOption, LeaseLost
from sqlbroker.core.policies import DeadLetterNow, RetryPolicy
from sqlbroker.core.sagas import Saga, SagaInstance, Step
from sqlbroker.core.serde import encode_json
from sqlbroker.features.sagas import Sagas
from sqlbroker.runtime.message import Message

log = logging.getLogger("sqlbroker.sagas")

StepFunction = Callable[["StepContext"], Any]


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
    conn: Any = None


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
    )


def saga_handler(
    sagas: Callable[[], Sagas],
    saga: Saga,
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
    if transactional and _is_async(function):
        raise InvalidOption(
            "transactional", "a transactional step is a plain function (it runs in a thread)"
        )
    runner = _StepRunner(sagas, saga, step, function, undo, transactional, retry)

    async def handle(msg: Message) -> None:
        await runner.handle(msg)

    handle.__name__ = f"saga_{saga.name}_{step.name}{'_undo' if undo else ''}"
    return handle


class _StepRunner:
    def __init__(
        self,
        sagas: Callable[[], Sagas],
        saga: Saga,
        step: Step,
        function: StepFunction,
        undo: bool,
        transactional: bool,
        retry: RetryPolicy,
    ) -> None:
        self._sagas = sagas
        self._saga = saga
        self._step = step
        self._function = function
        self._undo = undo
        self._transactional = transactional
        self._retry = retry
        self._async = _is_async(function)

    def _verdict(self, state: SagaInstance | None, index: int, msg: Message) -> str:
        if self._undo:
            return Sagas.undo_verdict(state, index, msg.id)
        return Sagas.action_verdict(state, index, msg.id)

    def _context(self, state: SagaInstance, msg: Message, conn: Any = None) -> StepContext:
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

    async def handle(self, msg: Message) -> None:
        payload = msg.payload if isinstance(msg.payload, dict) else {}
        saga_id, index = payload.get("saga_id"), payload.get("step")
        if not isinstance(saga_id, str) or not isinstance(index, int):
            log.warning("%s: message %s is not a saga step; dropped", msg.subscription, msg.id)
            return
        sagas = self._sagas()
        state = await asyncio.to_thread(sagas.find, saga_id)
        verdict = self._verdict(state, index, msg)
        if verdict == "stale":
            return
        if verdict == "skip":
            await asyncio.to_thread(self._record, msg, "skip", saga_id, index, None)
            return
        assert state is not None
        try:
            if self._transactional:
                await asyncio.to_thread(self._run_in_transaction, msg, saga_id, index)
                return
            if self._async:
                output = await self._function(self._context(state, msg))
            else:
                output = await asyncio.to_thread(self._function, self._context(state, msg))
            text = None if self._undo else encode_json(output)
        except LeaseLost:
            raise
        except Exception as error:
            await self._failed(msg, saga_id, index, error)
            return
        await asyncio.to_thread(self._record, msg, "done", saga_id, index, text)

    def _run_in_transaction(self, msg: Message, saga_id: str, index: int) -> None:
        sagas = self._sagas()
        with msg.transaction() as conn:
            state = sagas.lock(conn, saga_id)
            if self._verdict(state, index, msg) != "run":
                return
            assert state is not None
            output = self._function(self._context(state, msg, conn))
            self._transition(sagas, conn, msg, "done", saga_id, index, encode_json(output))

    def _record(
        self, msg: Message, outcome: str, saga_id: str, index: int, detail: str | None
    ) -> None:
        sagas = self._sagas()
        with msg.transaction() as conn:
            self._transition(sagas, conn, msg, outcome, saga_id, index, detail)

    def _transition(
        self,
        sagas: Sagas,
        conn: Any,
        msg: Message,
        outcome: str,
        saga_id: str,
        index: int,
        detail: str | None,
    ) -> None:
        if outcome == "skip":
            sagas.action_skipped(conn, saga_id, index, msg.id)
        elif outcome == "done" and self._undo:
            sagas.undo_done(conn, saga_id, index, msg.id, msg.attempt)
        elif outcome == "done":
            sagas.action_done(conn, saga_id, index, msg.id, detail or "null", msg.attempt)
        else:
            sagas.action_failed(conn, saga_id, index, msg.id, detail or "failed", msg.attempt)

    async def _failed(self, msg: Message, saga_id: str, index: int, error: Exception) -> None:
        decision = self._retry.decide(msg.attempt, error, max_attempts=msg.max_attempts)
        if not isinstance(decision, DeadLetterNow):
            raise error
        reason = decision.reason
        if str(error) != reason:
            reason = f"{reason} ({type(error).__name__}: {error})"
        if not self._undo:
            log.warning("saga %s: step %s failed for good: %s", saga_id, self._step.name, reason)
            await asyncio.to_thread(self._record, msg, "failed", saga_id, index, reason)
            return
        # The saga is marked failed in a transaction of its own; the message then goes to the
        # dead letters through the usual write-back. A crash in between redelivers it and
        # the compensation simply runs once more.
        await asyncio.to_thread(
            self._sagas().compensation_failed, saga_id, index, msg.id, reason, msg.attempt
        )
        raise error
