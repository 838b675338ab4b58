"""The schedules of both faces, as plans (see :mod:`sqlbroker.features.faces`): listed,
paused, resumed and deleted here; defined and run by the multi-step plans of
:mod:`sqlbroker.features.schedules`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Unpack

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidSchedule
from sqlbroker.core.schedules import Schedule
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.faces import Plan, call
from sqlbroker.features.schedules import (
    ScheduleOptions,
    ScheduleRun,
    public_schedule,
    schedule_define,
    schedule_run_due,
    ticks_of,
)
from sqlbroker.storage.schedules import ScheduleRecord

if TYPE_CHECKING:
    from sqlbroker.client.base import BrokerBase


def schedule(
    broker: BrokerBase, name: str, topic: str, payload: Any, **options: Unpack[ScheduleOptions]
) -> Plan[Schedule]:
    """Publish ``payload`` to ``topic`` on a schedule: ``cron="0 3 * * *"`` (croniter,
    in the time zone ``tz``) or ``every=`` seconds or a timedelta. Durable: workers
    (or :meth:`run_due_schedules`) publish each tick exactly once, however many run.

    Upserts by ``name``: the same definition again changes nothing; the same timing
    with other options keeps the next run; a new timing recomputes it. ``start_at``:
    no tick before it (an interval's ticks count from it; without it the first is one
    interval from now). ``missed``: what to do with ticks that passed while nothing
    ran — ``"latest"`` (publish the most recent one), ``"skip"`` (none; a tick at most
    ``grace`` seconds late is on time, not missed) or ``"all"`` (each of them, at most
    1000 at once). Each tick's message carries the headers ``sqlbroker-schedule``
    (the name) and ``sqlbroker-tick`` (the tick's time, ISO 8601 in UTC), and the
    idempotency key ``schedule:<name>:<tick>``. The other options are as in
    :meth:`publish`. Everything is validated before anything is written.
    """
    defaults = broker.publish_defaults
    return (yield from schedule_define(defaults, name, topic, payload, **options))


def unschedule(broker: BrokerBase, name: str) -> Plan[bool]:
    """Delete a schedule; return whether it existed. Messages it published stay."""
    deleted: bool = yield call("schedule_delete", name=validate_topic(name, "name"))
    return deleted


def schedules(broker: BrokerBase, names: Iterable[str] | None = None) -> Plan[list[Schedule]]:
    """Every schedule (or the named ones), by name, with its next and last run."""
    chosen = None
    if names is not None:
        if isinstance(names, str):
            raise InvalidSchedule("names", "must be a list of schedule names")
        chosen = [
            validate_topic(name, "names")
            for name in validate.items(names, "names", "schedule names")
        ]
    found: list[ScheduleRecord] = yield call("schedule_list", names=chosen)
    return [public_schedule(r) for r in found]


def pause_schedule(broker: BrokerBase, name: str) -> Plan[bool]:
    """Publish no ticks of ``name`` until :meth:`resume_schedule`; return whether it
    exists."""
    checked = validate_topic(name, "name")
    paused: bool = yield call("schedule_set_paused", name=checked, paused=True, next_run_at=None)
    return paused


def resume_schedule(broker: BrokerBase, name: str) -> Plan[bool]:
    """Resume a paused schedule from its first tick after now (ticks that fell while it
    was paused are not published); return whether it exists."""
    checked = validate_topic(name, "name")
    found: list[ScheduleRecord] = yield call("schedule_list", names=[checked])
    if not found:
        return False
    if not found[0].paused:
        return True
    following = ticks_of(found[0]).next_after((yield call("clock_now")))
    resumed: bool = yield call(
        "schedule_set_paused", name=checked, paused=False, next_run_at=following
    )
    return resumed


def run_due_schedules(broker: BrokerBase) -> Plan[ScheduleRun]:
    """One scheduler pass: publish every due tick and advance the schedules. Workers
    run this on their own; call it from scripts, cron jobs or tests."""
    return (yield from schedule_run_due(broker.publish_defaults))
