"""Saga state: instances and their steps (see :mod:`sqlbroker.features.sagas`).

A transition reads the saga with ``lock`` and writes it by compare-and-set on its version,
all inside one transaction (``backend.begin(conn)``): PostgreSQL holds the row lock
(``FOR UPDATE``); SQLite's write transaction holds the whole file, so its ``saga_lock``
is the plain read. Decoding never raises (see :mod:`sqlbroker.storage.columns`): a column
that does not decode takes a stand-in value and is named in the row's ``damaged`` text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlbroker.core.sagas import DueSaga, NewSaga, SagaInstance, SagaStep
from sqlbroker.storage.columns import Columns, record_of
from sqlbroker.storage.plan import Plan, atomic, changed, named, query, reads

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


@atomic
def insert(settings: Settings, *, saga: NewSaga) -> Plan[bool]:
    """Create a ``running`` saga at step 0 with its steps ``pending`` and its deadline
    ``timeout`` seconds away; False (and nothing written) when the id exists. Two
    statements: run it in a transaction (``begin``) so that the steps land with it."""
    created = yield query(
        "saga_insert", id=saga.id, name=saga.name, data=saga.data, timeout=saga.timeout
    )
    if not created:
        return False
    if saga.steps:
        yield query(
            "saga_steps_insert",
            saga_id=saga.id,
            names=[name for name, _ in saga.steps],
            compensate=[compensate for _, compensate in saga.steps],
        )
    return True


@reads
def get(
    settings: Settings, *, id: str, steps: bool = True, lock: bool = False
) -> Plan[SagaInstance | None]:
    """The saga (with its steps unless ``steps`` is false). ``lock`` inside a transaction
    holds the saga against other transitions until it ends."""
    row = yield named("saga_lock" if lock else "saga_get", id=id)
    if not row:
        return None
    step_rows = (yield named("saga_steps_get", id=id)) if steps else []
    return saga_of(row[0], step_rows)


def update(
    settings: Settings,
    *,
    id: str,
    version: int,
    status: str,
    step: int,
    error: str | None,
    message_id: str | None,
    restart_deadline: bool = False,
) -> Plan[bool]:
    """Compare-and-set: when the saga is still at ``version``, set its fields and bump the
    version (``restart_deadline``: the deadline becomes now + its timeout; a terminal
    status clears it and stamps ``finished_at``). False if it moved on."""
    return changed(
        "saga_update",
        id=id,
        version=version,
        status=status,
        step=step,
        error=error,
        message_id=message_id,
        restart_deadline=restart_deadline,
    )


def step_update(
    settings: Settings,
    *,
    saga_id: str,
    index: int,
    status: str,
    attempts: int = 0,
    output: str | None = None,
    error: str | None = None,
) -> Plan[bool]:
    """Set a step's status (stamping the time that status stands for), raise its attempts
    to at least ``attempts``, and set ``output`` (JSON text) and ``error`` when given."""
    return changed(
        "saga_step_update",
        saga_id=saga_id,
        idx=index,
        status=status,
        attempts=attempts,
        output=output,
        error=error,
    )


@reads
def list_(
    settings: Settings, *, name: str | None, status: str | None, limit: int
) -> Plan[list[SagaInstance]]:
    """Sagas, newest first, without their steps."""
    rows = yield named("saga_list", name=name, status=status, limit=limit)
    return [saga_of(row) for row in rows]


@reads
def due(settings: Settings, *, limit: int) -> Plan[list[DueSaga]]:
    """Non-terminal sagas whose deadline passed or whose awaited message is dead."""
    rows = yield query("saga_due", limit=limit)
    return [
        DueSaga(id=row[0], version=int(row[1]), expired=bool(row[2]), dead_reason=row[3])
        for row in rows
    ]


@reads
def counts(settings: Settings) -> Plan[dict[str, int]]:
    """How many sagas there are in each status."""
    rows = yield query("saga_counts")
    return {row[0]: int(row[1]) for row in rows}


def saga_step_of(row: Any) -> SagaStep:
    return record_of(SagaStep, Columns(row))


def saga_of(row: Any, steps: Sequence[Any] = ()) -> SagaInstance:
    columns = Columns(row)
    decoded = tuple(saga_step_of(item) for item in steps)
    for step in decoded:
        if step.damaged is not None:
            columns.note(f"step {step.index}", f"({step.damaged})")
    return record_of(
        SagaInstance, columns, id=lambda columns: str(columns.raw("id")), steps=lambda _: decoded
    )
