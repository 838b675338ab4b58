"""The dashboard's pages for features with their own tables — sagas and schedules — as
:class:`~sqlbroker.interfaces.dashboard.api.Extension` objects."""

from __future__ import annotations

from collections.abc import Callable

from sqlbroker.app import Broker
from sqlbroker.core.schedules import Schedule
from sqlbroker.interfaces.dashboard.api import Extension, Table

SCHEDULE_COLUMNS: dict[str, Callable[[Schedule], object]] = {
    "name": lambda s: s.name,
    "topic": lambda s: s.topic,
    "when": lambda s: s.cron if s.cron is not None else f"every {s.every:g} s",
    "time zone": lambda s: s.tz,
    "missed ticks": lambda s: s.missed.value,
    "next run": lambda s: "paused" if s.paused else s.next_run_at.isoformat(),
    "last run": lambda s: s.last_run_at.isoformat() if s.last_run_at else None,
    "last message": lambda s: s.last_message_id,
}


def schedules_table(broker: Broker) -> Table:
    rows = [[value(s) for value in SCHEDULE_COLUMNS.values()] for s in broker.schedules()]
    return Table(
        list(SCHEDULE_COLUMNS),
        rows,
        None if rows else "No schedules yet: broker.schedule(name, topic, payload, cron=…).",
    )


SAGA_ROWS = 50


def sagas_table(broker: Broker) -> Table:
    """The latest sagas, each with its step timeline: every step's name and status, in
    order (``charge: compensated → ship: failed``), and its error if it ended badly."""
    rows = []
    for listed in broker.sagas.list(limit=SAGA_ROWS):
        saga = broker.sagas.get(listed.id)
        timeline = " → ".join(f"{step.name}: {step.status.value}" for step in saga.steps)
        rows.append(
            [
                saga.id,
                saga.name,
                saga.status.value,
                timeline,
                saga.error,
                saga.created_at.isoformat(),
                (saga.finished_at or saga.updated_at).isoformat(),
            ]
        )
    counts = ", ".join(f"{n} {status}" for status, n in sorted(broker.sagas.counts().items()))
    return Table(
        ["id", "saga", "status", "steps", "error", "started", "finished / updated"],
        rows,
        f"{counts} (the latest {SAGA_ROWS} are shown)" if rows else "No sagas yet.",
    )


BUILT_IN = (
    Extension("sagas", "Sagas", sagas_table),
    Extension("schedules", "Schedules", schedules_table),
)
