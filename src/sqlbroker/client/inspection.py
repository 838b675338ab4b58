"""What both faces show of the queues and the workers (pending copies, the archive, stats,
heartbeats, per-minute series, unrouted publishes, the audit trail), retention, the reaper's
pass and the schema (plans: see :mod:`sqlbroker.features.faces`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlbroker.core import observability as facts
from sqlbroker.core import validate
from sqlbroker.core.errors import NotFound
from sqlbroker.core.flow import KEEP, Flow, FlowLimits, Keep, Rate, flow_limits
from sqlbroker.core.message import (
    ArchivedMessage,
    Outcome,
    PendingMessage,
    Retention,
    State,
    SubscriptionStats,
)
from sqlbroker.core.observability import (
    AuditEntry,
    MinuteCounts,
    RareCount,
    SeriesPoint,
    WorkerInfo,
)
from sqlbroker.core.results import Result
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.faces import Plan, blocking, call
from sqlbroker.features.retention import retain, retention_seconds

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlbroker.client.base import BrokerBase


def migrate(broker: BrokerBase) -> Plan[list[int]]:
    """Apply pending schema migrations; safe when several processes migrate at once."""
    applied: list[int] = yield blocking(broker.backend.migrate)
    broker.backend.schema_files.check((yield call("schema_version")))
    broker._is_ready = True
    return applied


def schema_version(broker: BrokerBase) -> Plan[int]:
    """The database's applied schema version (0 for an empty database)."""
    version: int = yield call("schema_version")
    return version


def pending(
    broker: BrokerBase,
    subscription: str | None = None,
    *,
    state: State | str | None = None,
    limit: int = 100,
) -> Plan[list[PendingMessage]]:
    """Copies still in the queue (available, scheduled, blocked or running), oldest first."""
    subscription = None if subscription is None else validate_topic(subscription, "subscription")
    chosen = None if state is None else validate.member(state, State, "state")
    count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
    found: list[PendingMessage] = yield call(
        "message_list", subscription=subscription, state=chosen, limit=count
    )
    return found


def archive(
    broker: BrokerBase,
    subscription: str | None = None,
    *,
    outcome: Outcome | str | None = None,
    message_id: str | None = None,
    limit: int = 100,
) -> Plan[list[ArchivedMessage]]:
    """Finished copies, newest first."""
    subscription = None if subscription is None else validate_topic(subscription, "subscription")
    chosen = None if outcome is None else validate.member(outcome, Outcome, "outcome")
    count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
    canonical = None if message_id is None else validate.message_id(message_id)
    found: list[ArchivedMessage] = yield call(
        "archive_list", subscription=subscription, outcome=chosen, message_id=canonical, limit=count
    )
    return found


def stats(
    broker: BrokerBase, *, window: float | timedelta = facts.RATE_WINDOW
) -> Plan[list[SubscriptionStats]]:
    """Per subscription: ready, scheduled, running, blocked, dead, the oldest ready age,
    expired copies, publishes that replaced a pending copy (``replaced``, lifetime), and
    — from what workers recorded over the last ``window`` seconds —
    completed, retried and dead-lettered per minute and handler time p50/p95, and whether
    flow limits hold claims back now (``throttled``)."""
    seconds = facts.window_seconds(window)
    gauges: list[SubscriptionStats] = yield call("stats_collect")
    now: datetime = yield call("clock_now")
    since = now - timedelta(seconds=seconds)
    # A counter row covers a whole minute: take every minute that overlaps the window, and
    # divide by the time those rows cover — from the start of the first to now (the current
    # minute's row holds what happened so far) — which is up to a minute more than the window.
    first_minute = facts.minute_floor(since)
    rows: list[MinuteCounts] = yield call("metric_minutes", since=first_minute)
    rare: list[RareCount] = yield call("archive_rare_counts", since=since)
    expired = {r.subscription: r.total for r in rare if r.outcome == "expired"}
    totals: dict[tuple[str, str], int] = yield call("metric_totals")
    kept = {r.subscription: r for r in (yield from retention(broker))}
    limited: list[Flow] = yield call("flow_list", name=None)
    flows = {f.subscription: f for f in limited if f.limits.limited}
    per_minute = 60.0 / max((now - first_minute).total_seconds(), seconds)
    grouped = facts.grouped(rows, "subscription")
    found = []
    for gauge in gauges:
        name = gauge.subscription
        completed, retried, dead, p50, p95 = facts.summary(grouped.get(name, []))
        flow, own = flows.get(name), kept.get(name)
        found.append(
            replace(
                gauge,
                completed_per_minute=completed * per_minute,
                retried_per_minute=retried * per_minute,
                dead_per_minute=dead * per_minute,
                handler_p50=p50,
                handler_p95=p95,
                expired=expired.get(name, 0),
                replaced=totals.get((name, "replaced"), 0),
                throttled=flow is not None and flow.throttled,
                throttled_for=0.0 if flow is None else flow.throttled_for,
                archive_retention=None if own is None else own.archive,
                dead_retention=None if own is None else own.dead,
            )
        )
    return found


def workers(broker: BrokerBase) -> Plan[list[WorkerInfo]]:
    """Worker processes as their heartbeats last reported them, most recent first."""
    found: list[WorkerInfo] = yield call("worker_list")
    return found


def metrics_series(broker: BrokerBase, *, minutes: int = 60) -> Plan[dict[str, list[SeriesPoint]]]:
    """Per subscription, completed / retried / dead and handler p50/p95 for each of the
    last ``minutes`` minutes (the current one last), zeros where nothing was recorded."""
    count = validate.integer(minutes, "minutes", minimum=1, maximum=facts.MAX_SERIES_MINUTES)
    current = facts.minute_floor((yield call("clock_now")))
    axis = [current - timedelta(minutes=back) for back in range(count - 1, -1, -1)]
    rows: list[MinuteCounts] = yield call("metric_minutes", since=axis[0])
    grouped = facts.grouped(rows, "subscription")
    names = {s.name for s in (yield call("subscription_list"))} | set(grouped)
    return {name: facts.points(grouped.get(name, []), axis) for name in sorted(names)}


def unrouted(
    broker: BrokerBase, *, window: float | timedelta = facts.RATE_WINDOW
) -> Plan[facts.Unrouted]:
    """Publishes that matched no subscription: in the archive, and within ``window``."""
    since = (yield call("clock_now")) - timedelta(seconds=facts.window_seconds(window))
    rare: list[RareCount] = yield call("archive_rare_counts", since=since)
    found = [r for r in rare if r.outcome == "unrouted"]
    return facts.Unrouted(total=sum(r.total for r in found), recent=sum(r.recent for r in found))


def audit(
    broker: BrokerBase, *, limit: int = 100, before_id: int | None = None
) -> Plan[list[AuditEntry]]:
    """Replays and purges of dead letters, pauses, resumes and flow limit changes (who,
    when, which, why), newest first."""
    count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
    if before_id is not None:
        before_id = validate.integer(before_id, "before_id", minimum=1, maximum=2**63 - 1)
    found: list[AuditEntry] = yield call("audit_list", limit=count, before_id=before_id)
    return found


def retention(broker: BrokerBase, subscription: str | None = None) -> Plan[list[Retention]]:
    """How long each subscription (or one) keeps its archive rows and dead letters: its
    own times or the broker's defaults. ``NotFound`` for an unknown subscription."""
    subscription = None if subscription is None else validate_topic(subscription, "subscription")
    defaults = broker._retention
    rows: list[tuple[str, float | None, float | None]] = yield call(
        "retention_list", name=subscription
    )
    _named(subscription, rows)
    return [
        Retention(
            subscription=name,
            archive=defaults.archive if archive is None else archive,
            dead=defaults.dead if dead is None else dead,
            archive_default=archive is None,
            dead_default=dead is None,
        )
        for name, archive, dead in rows
    ]


def set_retention(
    broker: BrokerBase,
    subscription: str,
    *,
    archive: float | timedelta | None = None,
    dead: float | timedelta | None = None,
    reset: bool = False,
) -> Plan[Retention]:
    """Give a subscription its own archive and/or dead-letter retention (``None``: leave
    it as it is; ``reset=True`` first returns both to the broker's defaults). Raises
    ``NotFound`` when there is no such subscription."""
    validate_topic(subscription, "subscription")
    reset = validate.flag(reset, "reset")
    archive_seconds = None if archive is None else retention_seconds(archive, "archive")
    dead_seconds = None if dead is None else retention_seconds(dead, "dead")
    if not (
        yield call(
            "retention_set",
            name=subscription,
            archive=archive_seconds,
            dead=dead_seconds,
            change_archive=reset or archive_seconds is not None,
            change_dead=reset or dead_seconds is not None,
        )
    ):
        raise NotFound(f"no subscription named {subscription!r}")
    (found,) = yield from retention(broker, subscription)
    return found


def result(
    broker: BrokerBase,
    message_id: str,
    *,
    wait: float | timedelta = 0.0,
    subscription: str | None = None,
) -> Plan[Result | None]:
    """The result of the message's copy: what its handler returned (``value``), or the
    error of a dead-lettered copy, or how it otherwise finished (docs/results.md).

    Returns ``None`` while the copy is not finished — after waiting up to ``wait``
    seconds for it, woken by a notification (PostgreSQL) or the change watcher
    (SQLite); on ``AsyncBroker`` the wait sleeps on the event loop and is cancelled with
    the calling task. A message fanned out to several subscriptions has one result per
    copy: name one with ``subscription`` (``InvalidOption`` lists them otherwise). An
    unknown message, or one whose records are gone, raises ``NotFound``. Values are kept
    for the broker's ``result_ttl``."""
    hub = broker.backend.result_hub
    return (
        yield from broker._results.lookup(hub, message_id, wait=wait, subscription=subscription)
    )


def reap(broker: BrokerBase, *, limit: int = 1000) -> Plan[dict[str, int]]:
    """One maintenance pass (the worker runs this periodically): release expired leases,
    dead-letter copies whose attempts are spent, expire TTLs, trim idempotency keys and
    processed keys past their window, stored results older than ``result_ttl`` and
    expired Celery results, and remove archive rows and dead letters past their
    retention (at most ``limit`` of each kind per pass)."""
    count = validate.integer(limit, "limit", minimum=1, maximum=100_000)
    leases = yield call("lease_release_expired", limit=count)
    counts: dict[str, int] = {"released": leases.released, "dead": leases.dead}
    for name, operation in (
        ("expired", "message_expire"),
        ("unblocked", "key_repair"),
        ("dedupe_trimmed", "dedupe_trim"),
        ("processed_trimmed", "processed_trim"),
    ):
        counts[name] = yield call(operation, limit=count)
    counts["results_trimmed"] = yield call("result_trim", ttl=broker.result_ttl, limit=count)
    counts["results_trimmed"] += yield call("task_result_trim", limit=count)
    counts["sagas_swept"] = yield blocking(broker.sagas.sweep, limit=count)
    counts.update((yield from retain(broker._retention, limit=count)))
    return counts


def flow(broker: BrokerBase, subscription: str | None = None) -> Plan[list[Flow]]:
    """Each subscription's (or one's) flow limits — concurrency caps, rate limits,
    fairness — with its running copies and whether claims wait now (``throttled``).
    See docs/flow-control.md. ``NotFound`` for an unknown subscription."""
    subscription = None if subscription is None else validate_topic(subscription, "subscription")
    found: list[Flow] = yield call("flow_list", name=subscription)
    _named(subscription, found)
    return found


def _named(subscription: str | None, found: Sequence[object]) -> None:
    """``NotFound`` when a view asked of one subscription found none: there is none of
    that name (a view of every subscription may be empty)."""
    if subscription is not None and not found:
        raise NotFound(f"no subscription named {subscription!r}")


def set_flow(
    broker: BrokerBase,
    subscription: str,
    *,
    reset: bool = False,
    max_running: int | Keep | None = KEEP,
    key_concurrency: int | Keep | None = KEEP,
    rate_limit: str | Rate | Keep | None = KEEP,
    key_rate_limit: str | Rate | Keep | None = KEEP,
    fair: bool | Keep = KEEP,
    actor: str | None = None,
    note: str | None = None,
) -> Plan[Flow]:
    """Change a subscription's flow limits for every worker and host: ``max_running``,
    ``key_concurrency`` (integers from 1), ``rate_limit``, ``key_rate_limit``
    (``"100/min"``, ``"5/s"`` or a :class:`Rate`), ``fair`` (bool). A limit given as
    ``None`` is removed; those not named stay (``reset=True``: are removed). Bad values
    raise ``ValidationError`` before anything is written; ``NotFound`` for an unknown
    subscription. A change is recorded in the audit trail (``subscription.flow``, the
    limits before and after; ``actor`` defaults to ``api:<user>``)."""
    named = {
        "max_running": max_running,
        "key_concurrency": key_concurrency,
        "rate_limit": rate_limit,
        "key_rate_limit": key_rate_limit,
        "fair": fair,
    }
    options = {name: value for name, value in named.items() if value is not KEEP}
    validate_topic(subscription, "subscription")
    validate.flag(reset, "reset")
    flow_limits(options)  # every value checked before any SQL
    who = validate.actor(actor)
    why = None if note is None else validate.reason(note, "note")
    base = FlowLimits() if reset else (yield from flow(broker, subscription))[0].limits
    limits = flow_limits(options, base=base)
    if not (yield call("flow_set", name=subscription, limits=limits, actor=who, note=why)):
        raise NotFound(f"no subscription named {subscription!r}")
    return (yield from flow(broker, subscription))[0]
