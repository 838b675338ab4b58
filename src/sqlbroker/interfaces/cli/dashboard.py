"""``sqlbroker dashboard``: serve the web dashboard, and ``sqlbroker audit``: list who
replayed or purged dead letters."""

from __future__ import annotations

import click

from sqlbroker.interfaces.cli.admin import broker_in, schema_option
from sqlbroker.interfaces.cli.params import PORT, POSITIVE_DURATION, json_option
from sqlbroker.interfaces.cli.render import human_time, listing
from sqlbroker.interfaces.cli.session import InvalidUsage, Session, listening, pass_session
from sqlbroker.interfaces.dashboard.server import DEFAULT_HOST, DEFAULT_PORT, Dashboard

TOKEN_ENV = "SQLBROKER_DASHBOARD_TOKEN"


@click.command()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    help="Address to listen on; anything but loopback needs --token.",
)
@click.option("--port", type=PORT, default=DEFAULT_PORT)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    metavar="TOKEN",
    help=f"Access token (at least 16 characters). Prefer ${TOKEN_ENV} or --token-file:"
    " a command line is visible to every local user (ps).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, readable=True),
    metavar="PATH",
    help="Read the access token from this file (its first line).",
)
@click.option(
    "--refresh",
    type=POSITIVE_DURATION,
    default=2.0,
    metavar="SECONDS",
    help="How often the page refreshes itself.",
)
@schema_option("PostgreSQL schema of the sqlbroker tables (default: the current schema).")
@pass_session
def dashboard(
    session: Session,
    host: str,
    port: int,
    token: str | None,
    token_file: str | None,
    refresh: float,
    pg_schema: str | None,
) -> None:
    """Serve the web dashboard for the database in --url until Ctrl-C.

    Overview (depth, lag, rates, sparklines, workers), a page per subscription
    (ready / scheduled / running messages, throughput and latency charts) and dead letters
    (filter, inspect, replay or purge with a confirmation; every action is audited).
    Binds to 127.0.0.1 unless told otherwise; with a token open /?token=TOKEN once.
    A remote dashboard (--host 0.0.0.0) needs a token and then answers to any host name.
    """
    if token_file is not None:
        token = _read_token(token_file, also_given=token is not None)
    broker = broker_in(session, pg_schema, read_only=True)
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
@click.option("--limit", type=int, default=50)
@json_option()
@pass_session
def audit(session: Session, limit: int, as_json: bool) -> None:
    """List replays and purges of dead letters: who, when, which and why, newest first."""
    listing(
        session.reader().audit(limit=limit),
        {
            "id": lambda a: a.id,
            "when": lambda a: human_time(a.at),
            "who": lambda a: a.actor,
            "action": lambda a: a.action,
            "dead letters": lambda a: _ids(a.detail.get("dead_ids")),
            "why": lambda a: a.detail.get("note"),
        },
        as_json=as_json,
        empty="no replays or purges yet",
        numeric=["id"],
        key="action",
        drop=["who", "when"],
    )


def _read_token(path: str, *, also_given: bool) -> str:
    if also_given:
        raise InvalidUsage(f"give the token once: --token-file, or --token / ${TOKEN_ENV}")
    try:
        with open(path, encoding="utf-8") as file:
            token = file.readline().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidUsage(f"cannot read --token-file {path}: {error}") from None
    if not token:
        raise InvalidUsage(f"--token-file {path} is empty")
    return token


def _ids(value: object) -> str:
    return ", ".join(str(item) for item in value) if isinstance(value, list) else ""
