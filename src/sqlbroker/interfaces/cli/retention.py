"""``sqlbroker subscriptions retention``: how long a subscription keeps its archive rows
and dead letters."""

from __future__ import annotations

import click

from sqlbroker.interfaces.cli.params import DURATION, json_option
from sqlbroker.interfaces.cli.render import human_age, listing
from sqlbroker.interfaces.cli.session import Session, name_to_set, pass_session


@click.command()
@click.argument("name", required=False)
@click.option("--archive", type=DURATION, help="Keep finished copies this long (7d).")
@click.option("--dead", type=DURATION, help="Keep dead letters this long (30d).")
@click.option(
    "--default",
    "reset",
    is_flag=True,
    help="Return both to the broker's defaults (before --archive/--dead, if given).",
)
@json_option()
@pass_session
def retention(
    session: Session,
    name: str | None,
    archive: float | None,
    dead: float | None,
    reset: bool,
    as_json: bool,
) -> None:
    """Show or set how long subscriptions keep finished copies and dead letters.

    Without options, show every subscription's times (or NAME's). With --archive, --dead or
    --default, set NAME's own times; the reaper removes what is older. The defaults are 7
    days (archive) and 30 days (dead letters), or the worker's Broker(archive_retention=,
    dead_retention=).
    """
    if archive is None and dead is None and not reset:
        rows = session.reader().retention(name)
    else:
        target = name_to_set(name, "retention")
        rows = [session.broker().set_retention(target, archive=archive, dead=dead, reset=reset)]
    listing(
        rows,
        {
            "subscription": lambda r: r.subscription,
            "archive kept": lambda r: (
                human_age(r.archive) + (" (default)" if r.archive_default else "")
            ),
            "dead kept": lambda r: human_age(r.dead) + (" (default)" if r.dead_default else ""),
        },
        as_json=as_json,
        empty="no subscriptions yet",
        damaged=None,
    )
