"""``sqlbroker schedules`` (list, delete, pause, resume) and ``sqlbroker scheduler``.

Schedules are defined in code (``broker.schedule(…)``); the CLI shows them with their next
run and manages their lifecycle. ``sqlbroker scheduler`` publishes due ticks without
running any subscriber, for deployments that keep scheduling apart from the workers
(workers schedule too, unless ``schedules=False``; running both is safe).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import click

from sqlbroker.core.serde import jsonable
from sqlbroker.interfaces import logs
from sqlbroker.interfaces.cli.params import POSITIVE_DURATION, json_option, log_level_option
from sqlbroker.interfaces.cli.render import echo_json, human_time, listing
from sqlbroker.interfaces.cli.session import CliFailure, Session, pass_session
from sqlbroker.runtime.scheduler import Scheduler

log = logging.getLogger("sqlbroker.cli")


def _show(session: Session, as_json: bool) -> None:
    rows = session.reader().schedules()
    if as_json:
        echo_json([{**jsonable(s), "spec": s.spec} for s in rows])
        return
    listing(
        rows,
        {
            "name": lambda s: s.name,
            "topic": lambda s: s.topic,
            "schedule": lambda s: s.spec,
            "tz": lambda s: s.tz,
            "missed": lambda s: s.missed.value,
            "next run": lambda s: "paused" if s.paused else human_time(s.next_run_at),
            "last run": lambda s: human_time(s.last_run_at),
        },
        as_json=False,
        empty="no schedules yet",
        damaged=None,
        drop=["missed", "tz", "last run", "topic"],
    )


@click.group(invoke_without_command=True)
@json_option()
@pass_session
@click.pass_context
def schedules(ctx: click.Context, session: Session, as_json: bool) -> None:
    """List schedules with their next run; delete, pause or resume one.

    Without a subcommand, lists every schedule: what it publishes, when (cron expression
    or interval, and time zone), its missed-tick policy, and its next and last run (UTC).
    """
    if ctx.invoked_subcommand is None:
        _show(session, as_json)


@schedules.command("list")
@json_option()
@pass_session
def list_schedules(session: Session, as_json: bool) -> None:
    """List schedules with their next run (same as ``sqlbroker schedules``)."""
    _show(session, as_json)


def _missing(name: str) -> CliFailure:
    return CliFailure(f"no schedule named {name!r}")


@schedules.command("delete")
@click.argument("name")
@pass_session
def delete_schedule(session: Session, name: str) -> None:
    """Delete the schedule NAME (messages it already published stay)."""
    if not session.broker().unschedule(name):
        raise _missing(name)
    click.echo(f"deleted schedule {name}")


@schedules.command("pause")
@click.argument("name")
@pass_session
def pause_schedule(session: Session, name: str) -> None:
    """Publish no ticks of NAME until it is resumed."""
    if not session.broker().pause_schedule(name):
        raise _missing(name)
    click.echo(f"paused schedule {name}")


@schedules.command("resume")
@click.argument("name")
@pass_session
def resume_schedule(session: Session, name: str) -> None:
    """Resume NAME from its first tick after now (ticks missed while paused are skipped)."""
    broker = session.broker()
    if not broker.resume_schedule(name):
        raise _missing(name)
    (state,) = broker.schedules([name])
    click.echo(f"resumed schedule {name}; next run {human_time(state.next_run_at)}")


@click.command()
@click.option(
    "--poll-interval",
    type=POSITIVE_DURATION,
    default=1.0,
    help="Longest pause between passes (new schedules are seen within it).",
)
@click.option("--once", is_flag=True, help="Run one pass, print what it published, and exit.")
@log_level_option
@pass_session
def scheduler(session: Session, poll_interval: float, once: bool, log_level: str) -> None:
    """Publish the due ticks of every schedule until SIGTERM or Ctrl-C.

    Any number of schedulers (and workers) may run against one database: each tick is
    published exactly once.
    """
    logs.configure(log_level)
    broker = session.broker()
    if once:
        run = broker.run_due_schedules()
        count = sum(len(ids) for ids in run.published.values())
        click.echo(f"published {count} tick message(s) for {len(run.published)} schedule(s)")
        return
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {
        signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        log.info("scheduler running on %s", session.display_url)
        Scheduler(poll_interval=poll_interval).run_forever(stop, broker.run_due_schedules)
        log.info("scheduler stopped")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
