"""Saga rows from either backend: JSON text decoded, times made aware UTC datetimes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlbroker.core.sagas import SagaInstance, SagaStatus, SagaStep, StepStatus
from sqlbroker.storage.rows import utc, utc_or_none

Row = Sequence[Any]


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def saga_step_of(row: Row) -> SagaStep:
    idx, name, compensate, status, attempts, output, error, started, finished, compensated = row
    return SagaStep(
        index=int(idx),
        name=name,
        compensate=bool(compensate),
        status=StepStatus(status),
        attempts=int(attempts),
        output=_json(output),
        error=error,
        started_at=utc_or_none(started),
        finished_at=utc_or_none(finished),
        compensated_at=utc_or_none(compensated),
    )


def saga_of(row: Row, steps: Sequence[Row] = ()) -> SagaInstance:
    (id_, name, status, data, step, version, error, message_id) = row[:8]
    created, updated, deadline, finished = row[8:12]
    return SagaInstance(
        id=id_,
        name=name,
        status=SagaStatus(status),
        data=_json(data),
        step=int(step),
        version=int(version),
        error=error,
        message_id=message_id,
        created_at=utc(created),
        updated_at=utc(updated),
        deadline=utc_or_none(deadline),
        finished_at=utc_or_none(finished),
        steps=tuple(saga_step_of(item) for item in steps),
    )
