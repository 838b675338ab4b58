"""Read-only views: ``stats``, ``pending``, ``archive`` and ``subscriptions``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

import click
from rich.live import Live
from rich.table import Table

from sqlbroker.app import Broker
from sqlbroker.core.message import Outcome, State, SubscriptionStats
from sqlbroker.interfaces.cli.params import POSITIVE_DURATION, json_option
from sqlbroker.interfaces.cli.render import (
    console,
    echo_json,
    human_age,
    human_time,
    listing,
    print_table,
    table_of,
)
from sqlbroker.interfaces.cli.session import InvalidUsage, Session, found_in, pass_session

DEFAULT_WATCH_INTERVAL = 2.0


def human_duration(seconds: float | None) -> str:
    """A handler time: ``-``, ``850µs``, ``12ms``, ``1.5s``."""
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.1f}s"


_ERROR_PREVIEW = 60


_STATS: dict[str, Callable[[SubscriptionStats], object]] = {
    "subscription": lambda s: (
        s.subscription + (" (paused)" if s.paused else "") + (" (throttled)" if s.throttled else "")
    ),
    "ready": lambda s: s.ready,
    "scheduled": lambda s: s.scheduled,
    "running": lambda s: s.running,
    "blocked": lambda s: s.blocked,
    "dead": lambda s: s.dead,
    "oldest ready": lambda s: human_age(s.oldest_ready_age),
    "done/min": lambda s: f"{s.completed_per_minute:.1f}",
    "retry/min": lambda s: f"{s.retried_per_minute:.1f}",
    "dead/min": lambda s: f"{s.dead_per_minute:.1f}",
    "p50": lambda s: human_duration(s.handler_p50),
    "p95": lambda s: human_duration(s.handler_p95),
    "expired": lambda s: s.expired,
    "replaced": lambda s: s.replaced,
    "archive kept": lambda s: human_age(s.archive_retention),
    "dead kept": lambda s: human_age(s.dead_retention),
}


def stats_table(rows: Sequence[SubscriptionStats], *, title: str | None = None) -> Table:
    """The per-subscription stats table; ``oldest ready`` is the consumer lag, rates are
    per minute over the last five minutes, p50/p95 are handler times."""
    return table_of(
        title,
        rows,
        _STATS,
        numeric=list(_STATS)[1:],
        key="subscription",
        drop=[
            "dead kept",
            "archive kept",
            "replaced",
            "expired",
            "retry/min",
            "dead/min",
            "p50",
            "scheduled",
            "blocked",
            "done/min",
            "p95",
            "running",
        ],
    )


def _snapshots(
    broker: Broker, interval: float, count: int | None
) -> Iterator[list[SubscriptionStats]]:
    """``broker.stats()`` every ``interval`` seconds, ``count`` times or until interrupted."""
    taken = 0
    while True:
        yield broker.stats()
        taken += 1
        if count is not None and taken >= count:
            return
        time.sleep(interval)


@click.command()
@json_option("Print JSON (with --watch: one JSON line per refresh).")
@click.option(
    "--watch",
    type=POSITIVE_DURATION,
    is_flag=False,
    flag_value=DEFAULT_WATCH_INTERVAL,
    default=None,
    metavar="[SECONDS]",
    help=f"Refresh every SECONDS (default {DEFAULT_WATCH_INTERVAL:g}) until Ctrl-C.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    help="With --watch: stop after N refreshes.",
)
@pass_session
def stats(session: Session, as_json: bool, watch: float | None, count: int | None) -> None:
    """Queue depth and lag per subscription.

    Per subscription: ready, scheduled, running, blocked and dead messages, and the age
    of the oldest ready one (the consumer lag).
    """
    broker = session.reader()
    if watch is None:
        if count is not None:
            raise InvalidUsage("--count needs --watch")
        rows = broker.stats()
        if as_json:
            echo_json(rows)
        else:
            print_table(stats_table(rows), empty="no subscriptions yet")
        return
    snapshots = _snapshots(broker, watch, count)
    if as_json:
        for rows in snapshots:
            echo_json(rows, compact=True)
        return

    def view(rows: Sequence[SubscriptionStats]) -> Table:
        moment = datetime.now(UTC).strftime("%H:%M:%SZ")
        return stats_table(
            rows, title=f"{broker.url} at {moment} (every {watch:g}s, Ctrl-C to stop)"
        )

    out = console()
    if not out.is_terminal:
        # Piped: print each refresh in turn, like a log, rather than redrawing in place.
        for rows in snapshots:
            out.print(view(rows))
        return
    with Live(console=out, auto_refresh=False) as live:
        for rows in snapshots:
            live.update(view(rows), refresh=True)


def _error_summary(last_error: str | None) -> str | None:
    if not last_error:
        return None
    try:
        detail = json.loads(last_error)
        text = f"{detail['type']}: {detail['message']}"
    except (ValueError, TypeError, KeyError):
        text = last_error
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_PREVIEW else text[: _ERROR_PREVIEW - 1] + "…"


@click.command()
@click.argument("subscription", required=False)
@click.option("--state", type=click.Choice([s.value for s in State], case_sensitive=False))
@click.option("--limit", type=int, default=100)
@json_option()
@pass_session
def pending(
    session: Session, subscription: str | None, state: str | None, limit: int, as_json: bool
) -> None:
    """List messages still in the queue, oldest first.

    Shows available, scheduled, blocked and running copies of every subscription, or of
    SUBSCRIPTION only.
    """
    broker = session.reader()
    listing(
        found_in(broker, subscription, broker.pending(subscription, state=state, limit=limit)),
        {
            "id": lambda m: m.id,
            "subscription": lambda m: m.subscription,
            "topic": lambda m: m.topic,
            "state": lambda m: m.state.value,
            "priority": lambda m: m.priority,
            "key": lambda m: m.key,
            "attempts": lambda m: f"{m.attempts}/{m.max_attempts}",
            "available at": lambda m: human_time(m.available_at),
            "last error": lambda m: _error_summary(m.last_error),
        },
        as_json=as_json,
        empty="no pending messages",
        numeric=["id", "priority"],
        key="subscription",
        drop=["key", "priority", "available at", "attempts", "last error", "state"],
    )


@click.command()
@click.argument("subscription", required=False)
@click.option("--outcome", type=click.Choice([o.value for o in Outcome], case_sensitive=False))
@click.option("--message-id", help="Only the copies of this message.")
@click.option("--limit", type=int, default=100)
@json_option()
@pass_session
def archive(
    session: Session,
    subscription: str | None,
    outcome: str | None,
    message_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List finished messages, newest first.

    Finished means completed, expired, cancelled, or published to a topic nobody
    subscribed to (unrouted). All subscriptions unless SUBSCRIPTION is given.
    """
    broker = session.reader()
    found = broker.archive(subscription, outcome=outcome, message_id=message_id, limit=limit)
    listing(
        found_in(broker, subscription, found),
        {
            "id": lambda m: m.id,
            "message id": lambda m: m.message_id,
            "subscription": lambda m: m.subscription,
            "topic": lambda m: m.topic,
            "outcome": lambda m: m.outcome.value,
            "attempts": lambda m: m.attempts,
            "finished at": lambda m: human_time(m.finished_at),
        },
        as_json=as_json,
        empty="the archive is empty",
        numeric=["id", "attempts"],
        key="subscription",
        drop=["message id", "attempts", "finished at"],
    )


@click.group(invoke_without_command=True)
@json_option()
@click.pass_context
def subscriptions(ctx: click.Context, as_json: bool) -> None:
    """List subscriptions, their topic patterns and how long they keep finished copies
    (archive) and dead letters (see `subscriptions retention`)."""
    if ctx.invoked_subcommand is not None:
        return
    session: Session = ctx.obj
    broker = session.reader()
    kept = {r.subscription: r for r in broker.retention()}
    listing(
        broker.subscriptions(),
        {
            "name": lambda s: s.name,
            "patterns": lambda s: ", ".join(s.patterns),
            "archive kept": lambda s: human_age(kept[s.name].archive) if s.name in kept else "-",
            "dead kept": lambda s: human_age(kept[s.name].dead) if s.name in kept else "-",
            "created at": lambda s: human_time(s.created_at),
        },
        as_json=as_json,
        empty="no subscriptions yet",
        damaged="name",
        drop=["created at", "dead kept", "archive kept"],
    )
