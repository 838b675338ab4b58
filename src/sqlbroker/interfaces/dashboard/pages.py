"""The dashboard's pages for features with their own tables — sagas and schedules — as
:class:`~sqlbroker.interfaces.dashboard.api.Extension` objects."""

from __future__ import annotations

from sqlbroker.app import Broker
from sqlbroker.interfaces.dashboard.api import Extension, Table


def schedules_table(broker: Broker) -> Table:
    rows = [
        [
            s.name,
            s.topic,
            s.cron if s.cron is not None else f"every {s.every:g} s",
            s.tz,
            s.missed.value,
            "paused" if s.paused else s.next_run_at.isoformat(),
            s.last_run_at.isoformat() if s.last_run_at else None,
            s.last_message_id,
        ]
        for s in broker.schedules()
    ]
    return Table(
        [
            "name",
            "topic",
            "when",
            "time zone",
            "missed ticks",
            "next run",
            "last run",
            "last message",
        ],
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
