"""The ``sqlbroker`` command group and the console-script entry point."""

from __future__ import annotations

import click

from sqlbroker import __version__
from sqlbroker.client.base import DEFAULT_URL
from sqlbroker.interfaces.cli.admin import migrate, pause, resume, schema, subscribe
from sqlbroker.interfaces.cli.dashboard import audit, dashboard
from sqlbroker.interfaces.cli.dlq import dlq
from sqlbroker.interfaces.cli.flow import flow
from sqlbroker.interfaces.cli.messages import cancel, claim, publish, send
from sqlbroker.interfaces.cli.observe import healthcheck, metrics
from sqlbroker.interfaces.cli.pipeline import pipeline
from sqlbroker.interfaces.cli.results import result
from sqlbroker.interfaces.cli.retention import retention
from sqlbroker.interfaces.cli.sagas import saga
from sqlbroker.interfaces.cli.schedules import scheduler, schedules
from sqlbroker.interfaces.cli.security import roles, tenants
from sqlbroker.interfaces.cli.session import BrokerGroup, Session
from sqlbroker.interfaces.cli.views import archive, pending, stats, subscriptions
from sqlbroker.interfaces.cli.worker import worker

URL_ENV = "SQLBROKER_URL"


@click.group(
    cls=BrokerGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.option(
    "--url",
    envvar=URL_ENV,
    default=DEFAULT_URL,
    metavar="URL",
    help=(
        f"Database URL: sqlite:///path.db or postgresql://user@host/db (or ${URL_ENV}, which"
        " keeps a password out of `ps`)."
    ),
)
@click.version_option(__version__, "--version", "-V", prog_name="sqlbroker")
@click.pass_context
def cli(ctx: click.Context, url: str) -> None:
    """sqlbroker: a message broker that lives in your database.

    Failures print one "error: ..." line on stderr and exit 2 for invalid input or
    configuration (a bad value, an unusable URL, a refused login, a port in use), 1 for
    anything else, 130 on Ctrl-C. A password in the URL is never printed; prefer
    $SQLBROKER_URL to --url for one, as a command line shows in `ps`. Read-only commands
    never create or migrate a database.
    """
    session = Session(url)
    ctx.obj = session
    ctx.call_on_close(session.close)


for _command in (
    migrate,
    schema,
    send,
    publish,
    claim,
    result,
    stats,
    subscribe,
    subscriptions,
    pause,
    resume,
    cancel,
    pending,
    archive,
    dlq,
    saga,
    worker,
    metrics,
    healthcheck,
    dashboard,
    audit,
    schedules,
    scheduler,
    pipeline,
    roles,
    tenants,
):
    cli.add_command(_command)
subscriptions.add_command(retention)
subscriptions.add_command(flow)


def main() -> None:
    """Console-script entry point: run the CLI and exit with its status."""
    cli.main(prog_name="sqlbroker")
