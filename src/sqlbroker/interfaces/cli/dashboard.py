"""``sqlbroker dashboard``: serve the web dashboard, and ``sqlbroker audit``: list who
replayed or purged dead letters."""

from __future__ import annotations

import click

from sqlbroker.interfaces.cli.params import DURATION, json_option
from sqlbroker.interfaces.cli.render import echo_json, human_time, print_table, table
from sqlbroker.interfaces.cli.session import InvalidUsage, Session, listening, pass_session
from sqlbroker.interfaces.dashboard.server import DEFAULT_HOST, DEFAULT_PORT, Dashboard

TOKEN_ENV = "SQLBROKER_DASHBOARD_TOKEN"


@click.command()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to listen on; anything but loopback needs --token.",
)
@click.option(
    "--port", type=click.IntRange(min=0, max=65535), default=DEFAULT_PORT, show_default=True
)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    metavar="TOKEN",
    help=f"Access token (at least 16 characters; or ${TOKEN_ENV}).",
)
@click.option(
    "--refresh",
    type=DURATION,
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="How often the page refreshes itself.",
)
@pass_session
def dashboard(session: Session, host: str, port: int, token: str | None, refresh: float) -> None:
    """Serve the web dashboard for the database in --url until Ctrl-C.

    Overview (depth, lag, rates, sparklines, workers), a page per subscription
    (ready / scheduled / running messages, throughput and latency charts) and dead letters
    (filter, inspect, replay or purge with a confirmation; every action is audited).
    Binds to 127.0.0.1 unless told otherwise; with a token open /?token=TOKEN once.
    """
    if refresh <= 0:
        raise InvalidUsage("--refresh must be more than 0 seconds")
    broker = session.reader()
    # The whole life of the server: whether it binds when made or when started, an
    # address in use is one line naming it.
    with listening(host, port):
        board = Dashboard(broker, host=host, port=port, token=token, refresh=refresh)
        hint = " (open it once with ?token=… to log in)" if token else ""
        click.echo(
            f"dashboard for {session.display_url} on {board.url}{hint}; Ctrl-C to stop",
            err=True,
        )
        try:
            board.serve_forever()
        finally:
            board.stop()


@click.command()
@click.option("--limit", type=int, default=50, show_default=True)
@json_option()
@pass_session
def audit(session: Session, limit: int, as_json: bool) -> None:
    """List replays and purges of dead letters: who, when, which and why, newest first."""
    rows = session.reader().audit(limit=limit)
    if as_json:
        echo_json(rows)
        return
    body = [
        (
            a.id,
            human_time(a.at),
            a.actor,
            a.action,
            _ids(a.detail.get("dead_ids")),
            a.detail.get("note"),
        )
        for a in rows
    ]
    print_table(
        table(
            None,
            ["id", "when", "who", "action", "dead letters", "why"],
            body,
            numeric=["id"],
            key="action",
            drop=["who", "when"],
        ),
        empty="no replays or purges yet",
    )


def _ids(value: object) -> str:
    return ", ".join(str(item) for item in value) if isinstance(value, list) else ""
