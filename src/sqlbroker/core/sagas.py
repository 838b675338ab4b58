"""Saga definitions and the rows a saga leaves in its tables.

A :class:`Saga` is an ordered list of :class:`Step`; each step has an action and, when
``compensate`` is true, a compensation. The definition is data only: handlers are attached
by ``@broker.saga_step`` and ``@broker.saga_compensation``, and everything the coordinator
needs to move a saga on (step names, which ones compensate) is copied into the saga's rows
when it starts, so that any process can advance or sweep it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlbroker.core import validate
from sqlbroker.core.errors import IdempotencyConflict, InvalidOption, SqlbrokerError
from sqlbroker.core.topics import validate_topic

DEFAULT_SAGA_TIMEOUT = 3600.0
DEFAULT_STEP_TIMEOUT = 300.0
MAX_STEPS = 100


class SagaStatus(StrEnum):
    """Where a saga is. ``completed``, ``compensated`` and ``failed`` are terminal."""

    RUNNING = "running"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    COMPENSATED = "compensated"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (SagaStatus.COMPLETED, SagaStatus.COMPENSATED, SagaStatus.FAILED)


class StepStatus(StrEnum):
    """Where one step is.

    ``pending`` → ``running`` (its action's message is out) → ``done`` or ``failed`` (or
    ``cancelled`` when the saga turned back before the action ran); a ``done`` step that
    compensates → ``compensating`` (its compensation's message is out) → ``compensated``
    or ``compensation_failed``.
    """

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


class SagaConflict(IdempotencyConflict):
    """``start`` was called again with a saga id already used by different saga or data."""

    def __init__(self, saga_id: str, problem: str) -> None:
        self.saga_id = saga_id
        self.topic = "saga"
        self.idempotency_key = saga_id
        self.message_id = saga_id
        SqlbrokerError.__init__(self, f"saga id {saga_id!r} was already used {problem}")


@dataclass(frozen=True)
class Step:
    """One step: its ``name`` (a topic-like word, unique in its saga), whether it has a
    compensation, and ``timeout``: seconds one attempt of its action or compensation may
    run before it counts as failed (``None``: no limit). Its messages allow the broker's
    ``max_attempts``, which the step's retry policy may replace."""

    name: str
    compensate: bool = True
    timeout: float | None = DEFAULT_STEP_TIMEOUT

    def __post_init__(self) -> None:
        validate_topic(self.name, "step")
        if "." in self.name:
            raise InvalidOption("step", "a step name is one word, without dots")
        if not isinstance(self.compensate, bool):
            raise InvalidOption("compensate", "must be True or False")
        if self.timeout is not None:
            object.__setattr__(
                self, "timeout", validate.seconds(self.timeout, "timeout", allow_zero=False)
            )


@dataclass(frozen=True)
class Saga:
    """A saga definition: ``name``, its ``steps`` in order, and ``timeout``: seconds the
    forward run may take before the sweeper turns it back (and, once compensating, the
    seconds the compensations may take before the saga is marked ``failed``)."""

    name: str
    steps: tuple[Step, ...]
    timeout: float = DEFAULT_SAGA_TIMEOUT

    def __init__(
        self,
        name: str,
        steps: Sequence[Step | str],
        *,
        timeout: float | timedelta = DEFAULT_SAGA_TIMEOUT,
    ) -> None:
        validate_topic(name, "saga")
        if isinstance(steps, str) or not isinstance(steps, Sequence):
            raise InvalidOption("steps", "must be a list of Step (or step names)")
        built = tuple(Step(item) if isinstance(item, str) else item for item in steps)
        if not 1 <= len(built) <= MAX_STEPS:
            raise InvalidOption("steps", f"a saga has 1 to {MAX_STEPS} steps")
        if not all(isinstance(item, Step) for item in built):
            raise InvalidOption("steps", "must be a list of Step (or step names)")
        names = [step.name for step in built]
        if len(set(names)) != len(names):
            raise InvalidOption("steps", "step names must be unique within a saga")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "steps", built)
        object.__setattr__(self, "timeout", validate.seconds(timeout, "timeout", allow_zero=False))

    def step(self, name: str) -> Step:
        """The step called ``name`` (``InvalidOption`` naming the saga's steps otherwise)."""
        for step in self.steps:
            if step.name == name:
                return step
        known = ", ".join(step.name for step in self.steps)
        raise InvalidOption("step", f"saga {self.name!r} has no step {name!r} (it has {known})")

    def queue(self, step: str, *, undo: bool = False) -> str:
        """The queue carrying a step's action (or, with ``undo``, its compensation)."""
        return saga_queue(self.name, step, undo=undo)

    def queues(self) -> tuple[str, ...]:
        """Every queue its steps need a handler on: each action, each compensation."""
        return tuple(
            self.queue(step.name, undo=undo)
            for step in self.steps
            for undo in ((False, True) if step.compensate else (False,))
        )


class SagaWarning(UserWarning):
    """A saga was started, or a worker runs one, while some of its steps (or their
    compensations) have no handler in this process nor in any live worker: its sagas will
    wait at that step until a handler runs."""


def saga_queue(saga: str, step: str, *, undo: bool = False) -> str:
    return f"saga.{saga}.{step}.undo" if undo else f"saga.{saga}.{step}"


@dataclass(frozen=True, slots=True)
class SagaStep:
    """A step's row."""

    index: int
    name: str
    compensate: bool
    status: StepStatus
    attempts: int
    output: Any
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    compensated_at: datetime | None
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns; ``None`` for a sound row."""


@dataclass(frozen=True, slots=True)
class SagaInstance:
    """A saga's row, and its steps' rows when they were asked for.

    ``step`` is the index of the step whose message is out (its action while ``running``,
    its compensation while ``compensating``); ``message_id`` is that message.
    """

    id: str
    name: str
    status: SagaStatus
    data: Any
    step: int
    version: int
    error: str | None
    message_id: str | None
    created_at: datetime
    updated_at: datetime
    deadline: datetime | None
    finished_at: datetime | None
    steps: tuple[SagaStep, ...] = field(default=())
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns; ``None`` for a sound row."""

    def outputs(self) -> dict[str, Any]:
        """The outputs of the steps whose action completed, by step name."""
        return {
            step.name: step.output
            for step in self.steps
            if step.status
            in (
                StepStatus.DONE,
                StepStatus.COMPENSATING,
                StepStatus.COMPENSATED,
                StepStatus.COMPENSATION_FAILED,
            )
        }


@dataclass(frozen=True, slots=True)
class NewSaga:
    """What ``saga_insert`` writes: the instance and its steps as ``(name, compensate)``."""

    id: str
    name: str
    data: str
    steps: tuple[tuple[str, bool], ...]
    timeout: float


@dataclass(frozen=True, slots=True)
class DueSaga:
    """A non-terminal saga the sweeper must look at: its deadline passed, or the message
    it waits for was dead-lettered (``dead_reason``)."""

    id: str
    version: int
    expired: bool
    dead_reason: str | None
