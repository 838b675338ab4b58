"""Schedules on both backends: cron and interval ticks, time zones across DST, the missed
policies, redefinition, pause and resume, validation, and one message per tick however
many schedulers race. Time is a ManualClock; nothing here sleeps."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import sqlbroker
from helpers import table_counts
from sqlbroker import ManualClock, Missed
from sqlbroker.core.schedules import MAX_MISSED_TICKS
from sqlbroker.storage.schedules import ScheduleFire

START = datetime(2024, 3, 30, 12, 0, tzinfo=UTC)
PARIS = ZoneInfo("Europe/Paris")
MakeBroker = Callable[..., sqlbroker.Broker]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def sb(make_broker: MakeBroker, clock: ManualClock) -> sqlbroker.Broker:
    """A broker on the manual clock with a subscription that sees every tick."""
    broker = make_broker(clock=clock)
    broker.subscribe("seen", ["#"])
    return broker


def ticks(broker: sqlbroker.Broker, subscription: str = "seen") -> list[tuple[str, datetime]]:
    """``(schedule, tick)`` of every tick message delivered so far, by tick; completes them."""
    found: list[sqlbroker.Delivery] = []
    while batch := broker.claim(subscription, limit=1000):
        found.extend(batch)
        broker.complete(batch)
    result = []
    for delivery in found:
        name, tick = delivery.headers["sqlbroker-schedule"], delivery.headers["sqlbroker-tick"]
        assert delivery.idempotency_key == f"schedule:{name}:{tick}"
        result.append((name, datetime.fromisoformat(tick)))
    return sorted(result, key=lambda item: (item[1], item[0]))


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def step(broker: sqlbroker.Broker, clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    broker.run_due_schedules()


# --- cron and every -------------------------------------------------------------------------


def test_a_cron_schedule_publishes_each_tick_once(sb: sqlbroker.Broker, clock: ManualClock) -> None:
    created = sb.schedule("hourly", "reports.hourly", {"kind": "report"}, cron="0 * * * *")
    assert created.next_run_at == at(2024, 3, 30, 13)
    assert created.last_run_at is None
    assert created.spec == "cron 0 * * * *"
    run = sb.run_due_schedules()
    assert run.published == {}
    assert run.next_run_at == at(2024, 3, 30, 13)
    assert run.wake_in == 3600
    step(sb, clock, 1800)
    assert ticks(sb) == []
    step(sb, clock, 1800)
    sb.run_due_schedules()  # a second pass at the same moment publishes nothing more
    assert ticks(sb) == [("hourly", at(2024, 3, 30, 13))]
    (state,) = sb.schedules()
    assert state.next_run_at == at(2024, 3, 30, 14)
    assert state.last_run_at == at(2024, 3, 30, 13)
    assert state.last_message_id is not None
    archived = sb.archive("seen", message_id=state.last_message_id)
    assert [a.payload for a in archived] == [{"kind": "report"}]
    assert archived[0].topic == "reports.hourly"


def test_an_interval_schedule_ticks_from_its_creation_without_drift(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    created = sb.schedule("beat", "beat", "♥", every=timedelta(seconds=90))
    assert created.next_run_at == START + timedelta(seconds=90)
    assert created.spec == "every 90s"
    for _ in range(6):
        step(sb, clock, 45)
    assert [tick for _, tick in ticks(sb)] == [START + timedelta(seconds=90 * n) for n in (1, 2, 3)]
    (state,) = sb.schedules()
    assert state.next_run_at == START + timedelta(seconds=360)


def test_start_at_sets_the_first_tick(sb: sqlbroker.Broker, clock: ManualClock) -> None:
    later = START + timedelta(hours=2, minutes=7)
    every = sb.schedule("every", "t.every", 1, every=600, start_at=later)
    assert every.next_run_at == later
    cron = sb.schedule("cron", "t.cron", 1, cron="*/30 * * * *", start_at=later)
    assert cron.next_run_at == START + timedelta(hours=2, minutes=30)
    # A start in the past: an interval keeps its grid, ticks still ahead only.
    past = sb.schedule("past", "t.past", 1, every=600, start_at=START - timedelta(seconds=65))
    assert past.next_run_at == START + timedelta(seconds=535)
    step(sb, clock, 2 * 3600 + 7 * 60)
    names = [name for name, _ in ticks(sb)]
    assert names.count("every") == 1
    assert names.count("cron") == 0


def test_the_tick_message_carries_the_schedule_s_options(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    sb.schedule(
        "opts",
        "t.opts",
        {"x": 1},
        every=60,
        headers={"team": "ops"},
        priority=sqlbroker.URGENT,
        key="k1",
        ttl=3600,
        max_attempts=2,
    )
    step(sb, clock, 60)
    (delivery,) = sb.claim("seen")
    assert delivery.headers == {
        "team": "ops",
        "sqlbroker-schedule": "opts",
        "sqlbroker-tick": (START + timedelta(seconds=60)).isoformat(),
    }
    assert (delivery.priority, delivery.key, delivery.max_attempts) == (0, "k1", 2)
    assert delivery.expires_at == START + timedelta(seconds=3660)
    assert delivery.payload == {"x": 1}


# --- time zones -----------------------------------------------------------------------------


def test_cron_ticks_follow_the_time_zone_across_dst_changes(
    make_broker: MakeBroker,
) -> None:
    """Europe/Paris: 09:00 local is 08:00Z in winter and 07:00Z in summer; the spring-forward
    day (2024-03-31) has 23 hourly ticks, the fall-back day (2024-10-27) 25, one per UTC
    hour, never two at one instant. 02:30 local does not exist on the spring-forward day
    (croniter runs it at 03:00) and happens twice on the fall-back day (croniter runs it
    twice): docs/schedules.md says so."""
    for first_day, (daily_before, daily_after), hours, night in (
        (
            at(2024, 3, 30),
            (at(2024, 3, 30, 8), at(2024, 3, 31, 7)),
            23,
            [at(2024, 3, 30, 1, 30), at(2024, 3, 31, 1)],
        ),
        (
            at(2024, 10, 26),
            (at(2024, 10, 26, 7), at(2024, 10, 27, 8)),
            25,
            [at(2024, 10, 26, 0, 30), at(2024, 10, 27, 0, 30), at(2024, 10, 27, 1, 30)],
        ),
    ):
        clock = ManualClock(first_day - timedelta(minutes=1))
        broker = make_broker(clock=clock)
        broker.subscribe("seen", ["#"])
        broker.schedule("morning", "t.morning", 0, cron="0 9 * * *", tz="Europe/Paris")
        broker.schedule("hourly", "t.hourly", 0, cron="0 * * * *", tz="Europe/Paris")
        broker.schedule("night", "t.night", 0, cron="30 2 * * *", tz="Europe/Paris")
        for _ in range(2 * 24 * 4):
            step(broker, clock, 900)
        found = ticks(broker)
        assert [tick for name, tick in found if name == "morning"] == [daily_before, daily_after]
        assert [tick for name, tick in found if name == "night"] == night
        hourly = [tick for name, tick in found if name == "hourly"]
        assert len(hourly) == len(set(hourly))
        assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(hourly))
        local_days = Counter(tick.astimezone(PARIS).date() for tick in hourly)
        transition = (first_day + timedelta(days=1)).date()
        assert local_days[transition] == hours
        for name in ("morning", "hourly", "night"):
            broker.unschedule(name)


# --- missed ticks ---------------------------------------------------------------------------


def test_missed_latest_publishes_the_most_recent_tick_once(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    sb.schedule("s", "t.s", 0, every=60)
    step(sb, clock, 10 * 60 + 30)
    assert ticks(sb) == [("s", START + timedelta(minutes=10))]
    assert sb.schedules()[0].next_run_at == START + timedelta(minutes=11)


def test_missed_skip_publishes_none_of_the_missed_ticks(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    sb.schedule("late", "t.late", 0, every=60, missed="skip", grace=10)
    sb.schedule("on-time", "t.on-time", 0, every=60, missed=Missed.SKIP, grace=45)
    step(sb, clock, 10 * 60 + 30)
    # The tick at 10 min is 30 s old: past one schedule's grace, within the other's.
    assert ticks(sb) == [("on-time", START + timedelta(minutes=10))]
    assert {s.name: s.next_run_at for s in sb.schedules()} == {
        "late": START + timedelta(minutes=11),
        "on-time": START + timedelta(minutes=11),
    }
    step(sb, clock, 35)
    assert [name for name, _ in ticks(sb)] == ["late", "on-time"]


def test_missed_all_publishes_every_missed_tick_in_order(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    sb.schedule("all", "t.all", 0, cron="*/5 * * * *", missed="all")
    step(sb, clock, 3600 + 60)
    assert [tick for _, tick in ticks(sb)] == [
        START + timedelta(minutes=5 * n) for n in range(1, 13)
    ]
    assert sb.schedules()[0].next_run_at == START + timedelta(minutes=65)


def test_missed_all_is_bounded(sb: sqlbroker.Broker, clock: ManualClock) -> None:
    sb.schedule("all", "t.all", 0, every=1, missed="all")
    step(sb, clock, MAX_MISSED_TICKS + 500)
    found = [tick for _, tick in ticks(sb)]
    end = START + timedelta(seconds=MAX_MISSED_TICKS + 500)
    assert found == [end - timedelta(seconds=n) for n in reversed(range(MAX_MISSED_TICKS))]


# --- redefinition, pause, delete ------------------------------------------------------------


def test_redefining_keeps_or_recomputes_the_next_run(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    first = sb.schedule("r", "t.r", {"v": 1}, every=600)
    clock.advance(120)
    same = sb.schedule("r", "t.r", {"v": 1}, every=600)
    assert same == first
    assert same.updated_at == first.updated_at
    payload = sb.schedule("r", "t.r", {"v": 2}, every=600, priority=1)
    assert payload.next_run_at == first.next_run_at
    assert (payload.payload, payload.priority) == ({"v": 2}, 1)
    assert payload.updated_at > first.updated_at
    retimed = sb.schedule("r", "t.r", {"v": 2}, every=300, priority=1)
    assert retimed.next_run_at == START + timedelta(seconds=120 + 300)
    cron = sb.schedule("r", "t.r", {"v": 2}, cron="0 * * * *", priority=1)
    assert (cron.cron, cron.every, cron.next_run_at) == ("0 * * * *", None, at(2024, 3, 30, 13))
    assert len(sb.schedules()) == 1
    step(sb, clock, 3600)
    assert ticks(sb) == [("r", at(2024, 3, 30, 13))]


def test_a_paused_schedule_publishes_nothing_and_resumes_after_now(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    sb.schedule("p", "t.p", 0, every=60, missed="all")
    assert sb.pause_schedule("p") is True
    assert sb.schedules()[0].paused
    step(sb, clock, 600)
    assert ticks(sb) == []
    assert sb.resume_schedule("p") is True
    state = sb.schedules()[0]
    assert not state.paused
    assert state.next_run_at == START + timedelta(minutes=11)
    step(sb, clock, 60)
    assert ticks(sb) == [("p", START + timedelta(minutes=11))]
    assert sb.resume_schedule("p") is True  # resuming a running schedule changes nothing
    assert sb.schedules()[0].next_run_at == START + timedelta(minutes=12)
    assert sb.pause_schedule("nope") is False
    assert sb.resume_schedule("nope") is False


def test_unschedule_stops_the_ticks(sb: sqlbroker.Broker, clock: ManualClock) -> None:
    sb.schedule("a", "t.a", 0, every=60)
    sb.schedule("b", "t.b", 0, every=60)
    assert sb.unschedule("a") is True
    assert sb.unschedule("a") is False
    step(sb, clock, 60)
    assert [name for name, _ in ticks(sb)] == ["b"]
    assert [s.name for s in sb.schedules()] == ["b"]
    assert [s.name for s in sb.schedules(["b", "zz"])] == ["b"]


# --- exactly once ---------------------------------------------------------------------------


def test_a_fire_that_lost_the_race_publishes_nothing(
    sb: sqlbroker.Broker, clock: ManualClock
) -> None:
    sb.schedule("race", "t.race", 0, every=60)
    clock.advance(60)
    due = sb.backend.schedule_due(limit=10)
    (record,) = due.due
    assert sb.run_due_schedules().published.keys() == {"race"}
    stale = ScheduleFire(
        name="race",
        expected_next_run_at=record.next_run_at,
        definition_hash=record.definition_hash,
        next_run_at=record.next_run_at + timedelta(seconds=60),
        last_run_at=record.next_run_at,
        messages=[],
    )
    assert sb.backend.schedule_fire_many(fires=[stale]) == {}
    assert len(ticks(sb)) == 1


def test_racing_schedulers_publish_each_tick_once(
    sb: sqlbroker.Broker, make_broker: MakeBroker, clock: ManualClock
) -> None:
    """Four brokers (each with its own connection pool), eight threads, all running the
    scheduler at every step of the clock: each tick is published exactly once."""
    sb.schedule("fast", "t.fast", 0, every=10, missed="all")
    sb.schedule("cron", "t.cron", 0, cron="* * * * *", missed="all")
    schedulers = [make_broker(clock=clock) for _ in range(4)]
    for _ in range(30):
        clock.advance(25)
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def run(
            broker: sqlbroker.Broker,
            barrier: threading.Barrier = barrier,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait(timeout=30)
                broker.run_due_schedules()
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=run, args=(b,)) for b in schedulers * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
    found = ticks(sb)
    assert len(found) == len(set(found))
    fast = [tick for name, tick in found if name == "fast"]
    assert fast == [START + timedelta(seconds=10 * n) for n in range(1, 76)]
    assert len([1 for name, _ in found if name == "cron"]) == 12


# --- validation -----------------------------------------------------------------------------

NAIVE = datetime(2024, 1, 1)


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({}, sqlbroker.InvalidSchedule, "cron"),
        ({"cron": "* * * * *", "every": 60}, sqlbroker.InvalidSchedule, "cron"),
        ({"cron": "61 * * * *"}, sqlbroker.InvalidSchedule, "cron"),
        ({"cron": "every day"}, sqlbroker.InvalidSchedule, "cron"),
        ({"cron": "0 0 30 2 *"}, sqlbroker.InvalidSchedule, "cron"),
        ({"cron": ""}, sqlbroker.InvalidSchedule, "cron"),
        ({"cron": 5}, sqlbroker.InvalidSchedule, "cron"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, sqlbroker.InvalidSchedule, "tz"),
        ({"cron": "* * * * *", "tz": "../etc/passwd"}, sqlbroker.InvalidSchedule, "tz"),
        ({"cron": "* * * * *", "tz": None}, sqlbroker.InvalidSchedule, "tz"),
        ({"every": 60, "tz": "Europe/Paris"}, sqlbroker.InvalidSchedule, "tz"),
        ({"every": 0}, sqlbroker.InvalidSchedule, "every"),
        ({"every": -5}, sqlbroker.InvalidDuration, "every"),
        ({"every": "60"}, sqlbroker.InvalidDuration, "every"),
        ({"every": float("nan")}, sqlbroker.InvalidDuration, "every"),
        ({"every": 60, "missed": "sometimes"}, sqlbroker.InvalidSchedule, "missed"),
        ({"every": 60, "grace": -1}, sqlbroker.InvalidDuration, "grace"),
        ({"every": 60, "start_at": NAIVE}, sqlbroker.InvalidTime, "start_at"),
        ({"every": 60, "headers": {"sqlbroker-tick": "x"}}, sqlbroker.InvalidHeaders, "headers"),
        ({"every": 60, "headers": {"a": 1}}, sqlbroker.InvalidHeaders, "headers"),
        ({"every": 60, "priority": 10}, sqlbroker.InvalidPriority, "priority"),
        ({"every": 60, "ttl": -1}, sqlbroker.InvalidDuration, "ttl"),
        ({"every": 60, "max_attempts": 0}, sqlbroker.InvalidOption, "max_attempts"),
        ({"every": 60, "key": ""}, sqlbroker.InvalidName, "key"),
        ({"every": 60, "payload": float("nan")}, sqlbroker.InvalidPayload, "payload"),
        ({"every": 60, "topic": "bad topic"}, sqlbroker.InvalidName, "topic"),
        ({"every": 60, "name": "bad name"}, sqlbroker.InvalidName, "name"),
    ],
)
def test_bad_definitions_are_refused_before_any_sql(
    sb: sqlbroker.Broker, options: dict[str, Any], error: type[Exception], field: str
) -> None:
    before = table_counts(sb.backend)
    assert "sqlbroker_schedule" in before
    arguments = {"name": "s", "topic": "t.s", "payload": {"ok": True}, **options}
    name, topic, payload = arguments.pop("name"), arguments.pop("topic"), arguments.pop("payload")
    with pytest.raises(error) as raised:
        sb.schedule(name, topic, payload, **arguments)
    assert isinstance(raised.value, sqlbroker.ValidationError)
    assert raised.value.field == field
    assert table_counts(sb.backend) == before


def test_interval_schedules_work_without_croniter(
    sb: sqlbroker.Broker, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "croniter", None)  # ``import croniter`` now fails
    sb.schedule("plain", "t.plain", 0, every=60)
    step(sb, clock, 60)
    assert ticks(sb) == [("plain", START + timedelta(seconds=60))]
    with pytest.raises(sqlbroker.ConfigurationError, match="croniter"):
        sb.schedule("cron", "t.cron", 0, cron="* * * * *")


def test_async_broker_schedules(backend_url: str, clock: ManualClock) -> None:
    async def scenario() -> None:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True, clock=clock) as broker:
            await broker.subscribe("seen", "#")
            created = await broker.schedule("a", "t.a", {"x": 1}, every=60)
            assert [s.name for s in await broker.schedules()] == ["a"]
            assert await broker.pause_schedule("a")
            assert await broker.resume_schedule("a")
            clock.advance(60)
            run = await broker.run_due_schedules()
            assert list(run.published) == ["a"]
            assert created.next_run_at == START + timedelta(seconds=60)
            assert await broker.unschedule("a")
            assert await broker.schedules() == []

    asyncio.run(scenario())
