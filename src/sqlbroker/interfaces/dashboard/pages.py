"""The dashboard's pages for features with their own tables: schedules (and sagas, once
they land), as :class:`~sqlbroker.interfaces.dashboard.api.Extension` objects."""

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


BUILT_IN = (Extension("schedules", "Schedules", schedules_table),)
