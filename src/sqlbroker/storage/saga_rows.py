"""Saga rows from either backend: JSON text decoded, times made aware UTC datetimes.

Decoding never raises (see :mod:`sqlbroker.storage.rows`): a column that does not decode
takes a stand-in value and is named in the row's ``damaged`` text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlbroker.core.sagas import SagaInstance, SagaStatus, SagaStep, StepStatus
from sqlbroker.storage.columns import (
    EPOCH,
    Columns,
    integer,
    json_text_or_none,
    text,
    text_or_none,
    utc,
    utc_or_none,
)

Row = Sequence[Any]

_STEP_COLUMNS = (
    "index",
    "name",
    "compensate",
    "status",
    "attempts",
    "output",
    "error",
    "started_at",
    "finished_at",
    "compensated_at",
)
_SAGA_COLUMNS = (
    "id",
    "name",
    "status",
    "data",
    "step",
    "version",
    "error",
    "message_id",
    "created_at",
    "updated_at",
    "deadline",
    "finished_at",
)


def saga_step_of(row: Row) -> SagaStep:
    columns = Columns(row, _STEP_COLUMNS)
    return SagaStep(
        index=columns.get("index", integer, 0),
        name=columns.get("name", text, ""),
        compensate=bool(columns.raw("compensate")),
        status=columns.get("status", StepStatus, StepStatus.PENDING),
        attempts=columns.get("attempts", integer, 0),
        output=columns.get("output", json_text_or_none, None),
        error=columns.get("error", text_or_none, None),
        started_at=columns.get("started_at", utc_or_none, None),
        finished_at=columns.get("finished_at", utc_or_none, None),
        compensated_at=columns.get("compensated_at", utc_or_none, None),
        damaged=columns.damaged,
    )


def saga_of(row: Row, steps: Sequence[Row] = ()) -> SagaInstance:
    columns = Columns(row[: len(_SAGA_COLUMNS)], _SAGA_COLUMNS)
    decoded = tuple(saga_step_of(item) for item in steps)
    for step in decoded:
        if step.damaged is not None:
            columns.note(f"step {step.index}", f"({step.damaged})")
    return SagaInstance(
        id=str(columns.raw("id")),
        name=columns.get("name", text, ""),
        status=columns.get("status", SagaStatus, SagaStatus.FAILED),
        data=columns.get("data", json_text_or_none, None),
        step=columns.get("step", integer, 0),
        version=columns.get("version", integer, 0),
        error=columns.get("error", text_or_none, None),
        message_id=columns.get("message_id", text_or_none, None),
        created_at=columns.get("created_at", utc, EPOCH),
        updated_at=columns.get("updated_at", utc, EPOCH),
        deadline=columns.get("deadline", utc_or_none, None),
        finished_at=columns.get("finished_at", utc_or_none, None),
        steps=decoded,
        damaged=columns.damaged,
    )
