"""Durable schedules: definitions, their validation, cron ticks and one scheduler pass.

``broker.schedule(name, topic, payload, cron=… | every=…)`` stores a definition; any
process running :func:`schedule_run_due` (``broker.run_due_schedules()``; every worker
does, see the runtime's scheduler task) publishes the due ticks. A tick is published
exactly once however many schedulers run: each advances a schedule by compare-and-set on
its next run, in the same transaction as the tick's publish, and the tick's message carries
the idempotency key ``schedule:<name>:<tick>`` as a second line of defence.

croniter is imported only for cron schedules, so ``every=`` works without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any, Unpack
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlbroker.core import validate
from sqlbroker.core.errors import ConfigurationError, InvalidHeaders, InvalidSchedule
from sqlbroker.core.message import NewMessage, new_message_id
from sqlbroker.core.schedules import (
    DEFAULT_GRACE,
    MIN_EVERY,
    RESERVED_HEADERS,
    SCHEDULE_HEADER,
    TICK_HEADER,
    EveryTicks,
    Missed,
    Schedule,
    TickSource,
    first_at_or_after,
    plan_ticks,
    tick_text,
)
from sqlbroker.core.serde import decode_payload, encode_json
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.faces import Plan, call
from sqlbroker.features.publishing import (
    MESSAGE_OPTIONS,
    MessageOptions,
    PublishDefaults,
    build_message,
)
from sqlbroker.storage.columns import headers_of
from sqlbroker.storage.rows import payload_hash
from sqlbroker.storage.schedules import (
    DueSchedules,
    ScheduleDefinition,
    ScheduleFields,
    ScheduleFire,
    ScheduleRecord,
)

log = logging.getLogger("sqlbroker.schedules")

DUE_BATCH = 100
"""Schedules fired per transaction in one scheduler pass."""
_MAX_CRON = 200
_MAX_TZ = 64
_MAX_GRACE = 7 * 86400.0


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError:
        raise ConfigurationError(
            "cron schedules need croniter: pip install 'sqlbroker[cron]'"
            " (interval schedules, every=…, work without it)"
        ) from None
    return croniter


@dataclass(frozen=True, slots=True)
class CronTicks:
    """The ticks of a cron expression in a time zone, as croniter computes them (so a
    daylight-saving change is handled the way croniter handles it), from ``start_at`` on."""

    expression: str
    tz: ZoneInfo
    start_at: datetime | None = None

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        croniter = _croniter()
        local = (moment + timedelta(microseconds=1)).astimezone(self.tz)
        found: datetime = croniter(self.expression, local).get_prev(datetime)
        tick = found.astimezone(moment.tzinfo)
        if self.start_at is not None and tick < self.start_at:
            return None
        return tick

    def next_after(self, moment: datetime) -> datetime:
        croniter = _croniter()
        if self.start_at is not None and moment < self.start_at:
            moment = self.start_at - timedelta(microseconds=1)
        found: datetime = croniter(self.expression, moment.astimezone(self.tz)).get_next(datetime)
        return found.astimezone(moment.tzinfo)


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz or len(tz) > _MAX_TZ or not tz.isprintable():
        raise InvalidSchedule(
            "tz", f"must be an IANA time zone name like 'Europe/Paris', not {tz!r}"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule("tz", f"unknown time zone {tz!r}") from None


def _cron(expression: object, zone: ZoneInfo) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidSchedule("cron", f"must be a cron expression string, not {expression!r}")
    if len(expression) > _MAX_CRON or not expression.isprintable():
        raise InvalidSchedule("cron", "must be printable and at most 200 characters")
    text = " ".join(expression.split())
    croniter = _croniter()
    from croniter import CroniterError

    try:
        croniter(text, datetime.now(zone)).get_next(datetime)
    except CroniterError as error:
        raise InvalidSchedule(
            "cron", f"{text!r} is not a usable cron expression: {error}"
        ) from None
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise InvalidSchedule("cron", f"{text!r} is not a cron expression: {error}") from None
    return text


def _missed(value: object) -> Missed:
    if isinstance(value, str) and value in Missed.__members__.values():
        return Missed(value)
    choices = ", ".join(repr(m.value) for m in Missed)
    raise InvalidSchedule("missed", f"must be one of {choices}, not {value!r}")


def _headers(value: object) -> dict[str, str] | None:
    checked = validate.headers(value)
    if checked is None:
        return None
    reserved = sorted(RESERVED_HEADERS & set(checked))
    if reserved:
        raise InvalidHeaders("headers", f"{', '.join(reserved)} is set by the scheduler")
    if len(checked) > validate.MAX_HEADERS - len(RESERVED_HEADERS):
        raise InvalidHeaders(
            "headers",
            f"a schedule's message has at most {validate.MAX_HEADERS - len(RESERVED_HEADERS)}"
            " headers of its own (the scheduler adds two)",
        )
    return checked


def _digest(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def ticks_of(record: ScheduleFields) -> TickSource:
    """The tick source of a schedule, stored or being defined."""
    if record.cron is not None:
        return CronTicks(record.cron, ZoneInfo(record.tz), record.start_at)
    assert record.every is not None
    assert record.anchor_at is not None
    return EveryTicks(record.anchor_at, record.every)


_AS_STORED = tuple(f.name for f in fields(Schedule) if f.name not in {"payload", "headers", "key"})
_MESSAGE_FIELDS = tuple(
    name for name in ScheduleFields.__slots__ if name in NewMessage.__slots__ and name != "headers"
)
"""The fields of a tick's message that its schedule holds as they are (topic, payload,
priority, …; its headers are held without the two the scheduler adds)."""


def public_schedule(record: ScheduleRecord) -> Schedule:
    """A stored schedule as :meth:`Broker.schedules` shows it: the fields both hold as
    stored, its payload decoded, its headers a mapping and its ordering key as ``key``."""
    return Schedule(
        **{name: getattr(record, name) for name in _AS_STORED},
        payload=decode_payload(record.payload, record.content_type),
        headers=headers_of(record.headers),
        key=record.ordering_key,
    )


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """What one scheduler pass did."""

    now: datetime
    """The storage clock's time the pass planned against."""
    published: dict[str, list[str]]
    """Message ids published, per schedule that this pass advanced."""
    next_run_at: datetime | None
    """The earliest next run of any schedule not paused, after this pass."""

    @property
    def wake_in(self) -> float | None:
        """Seconds from ``now`` to ``next_run_at`` (``None``: no schedules to wait for)."""
        if self.next_run_at is None:
            return None
        return max(0.0, (self.next_run_at - self.now).total_seconds())


class ScheduleOptions(MessageOptions, total=False):
    """The options of ``broker.schedule`` (see it), every one optional. Exactly one of
    ``cron`` and ``every`` is required; those its messages carry (``headers``,
    ``priority``, ``key``, ``ttl``, ``max_attempts`` and ``content_type``) are as in a
    publish (:class:`~sqlbroker.features.publishing.MessageOptions`, with their
    defaults)."""

    cron: str | None
    """A cron expression (croniter), in the time zone ``tz``."""
    every: float | timedelta | None
    """An interval, in seconds or a timedelta."""
    tz: str
    """The cron schedule's IANA time zone (default ``"UTC"``)."""
    missed: Missed | str
    """What to do with ticks that passed while nothing ran (default ``"latest"``)."""
    grace: float | timedelta
    """Seconds late a tick may be and still be on time (default 60)."""
    start_at: datetime | None
    """No tick before this point in time."""


def schedule_define(
    defaults: PublishDefaults,
    name: str,
    topic: str,
    payload: Any,
    **options: Unpack[ScheduleOptions],
) -> Plan[Schedule]:
    """Create or redefine the schedule ``name``; see ``Broker.schedule``."""
    validate.known_options(options, ScheduleOptions.__optional_keys__, "schedule")
    cron, every, start_at = options.get("cron"), options.get("every"), options.get("start_at")
    tz, missed = options.get("tz", "UTC"), options.get("missed", Missed.LATEST)
    grace = options.get("grace", DEFAULT_GRACE)
    name_text = validate_topic(name, "name")
    if (cron is None) == (every is None):
        raise InvalidSchedule("cron", "give exactly one of cron=… or every=…")
    zone = _zone(tz)
    assert isinstance(tz, str)
    cron_text = None if cron is None else _cron(cron, zone)
    every_s = None
    if every is not None:
        every_s = validate.seconds(every, "every")
        if every_s < MIN_EVERY:
            raise InvalidSchedule("every", f"must be at least {MIN_EVERY:g} s, not {every_s:g}")
        if tz != "UTC":
            raise InvalidSchedule(
                "tz",
                "applies to cron schedules only: an interval is elapsed time"
                " (use cron=… for wall-clock times in a time zone)",
            )
    policy = _missed(missed)
    grace_s = validate.seconds(grace, "grace", maximum=_MAX_GRACE)
    start = None if start_at is None else validate.point_in_time(start_at, "start_at")
    carried: dict[str, Any] = {k: v for k, v in options.items() if k in MESSAGE_OPTIONS}
    carried["headers"] = _headers(options.get("headers"))
    message = build_message(topic, payload, defaults=defaults, **carried)
    timing = {
        "cron": cron_text,
        "every": every_s,
        "tz": tz,
        "start_at": None if start is None else start.isoformat(),
    }
    definition_hash = _digest(
        {
            **timing,
            "topic": message.topic,
            "missed": policy.value,
            "grace": grace_s,
            "payload": payload_hash(message.payload, message.content_type),
            "headers": message.headers,
            "priority": message.priority,
            "key": message.ordering_key,
            "ttl": message.ttl,
            "max_attempts": message.max_attempts,
        }
    )
    now: datetime = yield call("clock_now")
    definition = ScheduleDefinition(
        **{field: getattr(message, field) for field in _MESSAGE_FIELDS},
        name=name_text,
        cron=cron_text,
        every=every_s,
        tz=tz,
        missed=policy,
        grace=grace_s,
        start_at=start,
        anchor_at=None if every_s is None else start or now + timedelta(seconds=every_s),
        headers=message.headers,
        definition_hash=definition_hash,
        timing_hash=_digest(timing),
        next_run_at=now,  # a stand-in: the first tick follows from the timing, just below
    )
    source = ticks_of(definition)
    # Ticks at or after start_at that are still ahead: a schedule never fires for a
    # moment before it was defined.
    first = (
        first_at_or_after(source, start)
        if start is not None and start > now
        else source.next_after(now)
    )
    record = yield call("schedule_upsert", definition=replace(definition, next_run_at=first))
    return public_schedule(record)


def schedule_run_due(defaults: PublishDefaults) -> Plan[ScheduleRun]:
    """One scheduler pass: publish the due ticks of every due schedule, under each
    schedule's missed policy, and advance them (each batch one transaction,
    ``schedule_fire_many``). Safe to run from any number of processes at once: each tick
    is published once."""
    published: dict[str, list[str]] = {}
    upcoming: list[datetime] = []
    while True:
        due: DueSchedules = yield call("schedule_due", limit=DUE_BATCH)
        fires = []
        for record in due.due:
            try:
                fires.append(_fire(record, due.now, defaults))
            except Exception:
                # One schedule that cannot compute its ticks (a croniter failure, a
                # time zone gone from this host) must not stop the others.
                log.exception(
                    "schedule %s: cannot plan its ticks",
                    record.name,
                    extra={"schedule": record.name},
                )
        if fires:
            published.update((yield call("schedule_fire_many", fires=fires)))
        # A fire lost to another scheduler advanced at least as far as planned here.
        upcoming.extend(fire.next_run_at for fire in fires)
        if due.next_run_at is not None:
            upcoming.append(due.next_run_at)
        if len(due.due) < DUE_BATCH or not fires:
            return ScheduleRun(
                now=due.now,
                published=published,
                next_run_at=min(upcoming) if upcoming else None,
            )


def _fire(record: ScheduleRecord, now: datetime, defaults: PublishDefaults) -> ScheduleFire:
    plan = plan_ticks(
        ticks_of(record),
        next_run_at=record.next_run_at,
        now=now,
        missed=record.missed,
        grace=record.grace,
    )
    if plan.dropped:
        # Dropping is the policy's job under latest and skip; under all it means the
        # catch-up hit its bound, which deserves a warning.
        log.log(
            logging.WARNING if record.missed is Missed.ALL else logging.INFO,
            "schedule %s: skipping missed ticks before %s (missed=%s)",
            record.name,
            tick_text(plan.ticks[0]) if plan.ticks else tick_text(plan.next_run_at),
            record.missed.value,
            extra={"schedule": record.name, "missed": record.missed.value},
        )
    own = headers_of(record.headers)
    stored = {field: getattr(record, field) for field in _MESSAGE_FIELDS}
    messages = []
    for tick in plan.ticks:
        when = tick_text(tick)
        messages.append(
            NewMessage(
                **stored,
                message_id=new_message_id(),
                headers=encode_json({**own, SCHEDULE_HEADER: record.name, TICK_HEADER: when}),
                idempotency_key=f"schedule:{record.name}:{when}",
                payload_hash=payload_hash(record.payload, record.content_type),
                delay=None,
                available_at=None,
                expires_at=None,
                dedupe_window=defaults.dedupe_window,
            )
        )
    return ScheduleFire(
        name=record.name,
        expected_next_run_at=record.next_run_at,
        definition_hash=record.definition_hash,
        next_run_at=plan.next_run_at,
        last_run_at=plan.ticks[-1] if plan.ticks else None,
        messages=messages,
    )
