"""Schema and subscription administration: ``migrate``, ``schema``, ``subscribe``,
``pause`` and ``resume``."""

from __future__ import annotations

from collections.abc import Callable

import click

from sqlbroker.app import Broker
from sqlbroker.core.errors import InvalidOption
from sqlbroker.interfaces.cli.params import F, note_option
from sqlbroker.interfaces.cli.session import InvalidUsage, Session, cli_actor, pass_session
from sqlbroker.storage.factory import backend_class
from sqlbroker.storage.url import parse_url


def schema_option(help: str) -> Callable[[F], F]:
    """``--schema NAME``: the PostgreSQL schema of the sqlbroker tables."""
    return click.option("--schema", "pg_schema", metavar="NAME", help=help)


def broker_in(session: Session, pg_schema: str | None, *, read_only: bool = False) -> Broker:
    """The session's broker, or (``pg_schema`` given) one on that PostgreSQL schema, closed
    with the command. ``--schema`` on SQLite is bad input (``InvalidOption``). A
    ``read_only`` command gets :meth:`Session.reader`'s broker: it creates and migrates
    nothing."""
    if pg_schema is None:
        return session.reader() if read_only else session.broker()
    broker = Broker(session.url, schema=pg_schema, migrate=False if read_only else None)
    click.get_current_context().call_on_close(broker.close)
    return broker


@click.command()
@schema_option("PostgreSQL schema to create or upgrade (default: the connection's current schema).")
@pass_session
def migrate(session: Session, pg_schema: str | None) -> None:
    """Apply pending schema migrations.

    Says which versions were applied. Safe to run from several processes at once;
    running it again changes nothing.
    """
    broker = broker_in(session, pg_schema)
    applied = broker.migrate()
    version = broker.schema_version()
    where = session.display_url + (f" (schema {pg_schema})" if pg_schema else "")
    if applied:
        versions = ", ".join(str(number) for number in applied)
        label = "migration" if len(applied) == 1 else "migrations"
        click.echo(f"applied {label} {versions} to {where}; schema is at version {version}")
    else:
        click.echo(f"schema is current at version {version}")


def schema_sql(url: str, pg_schema: str | None = None) -> str:
    """The full schema SQL for the database ``url`` names, built without connecting.

    ``pg_schema`` places the PostgreSQL tables in that schema; SQLite has none, so it is
    an ``InvalidOption`` there. Raises ``ConfigurationError`` when the PostgreSQL backend
    is not available.
    """
    from sqlbroker.storage.sqlite.backend import SqliteBackend

    backend = backend_class(parse_url(url))
    if issubclass(backend, SqliteBackend):
        if pg_schema is not None:
            raise InvalidOption("schema", "applies to PostgreSQL only; SQLite has no schemas")
        return backend.schema_sql()
    return backend.schema_sql(schema=pg_schema)


@click.command()
@click.option(
    "--print", "print_sql", is_flag=True, help="Print the full schema SQL, without connecting."
)
@schema_option("PostgreSQL schema for the tables (with --print).")
@pass_session
def schema(session: Session, print_sql: bool, pg_schema: str | None) -> None:
    """Show the schema version, or print the schema SQL.

    Without options, connects and shows the database's schema version. With --print,
    prints the SQL that creates the schema for the URL's backend, without connecting
    (for Alembic, Django or a DBA to apply).
    """
    if not print_sql:
        if pg_schema is not None:
            raise InvalidUsage("--schema needs --print")
        version = session.reader().schema_version()
        click.echo(f"{session.display_url}: schema version {version}")
        return
    click.echo(schema_sql(session.url, pg_schema).rstrip("\n"))


@click.command()
@click.argument("name")
@click.argument("patterns", nargs=-1, required=True)
@click.option(
    "--replace", is_flag=True, help="Set the patterns to exactly PATTERNS instead of adding them."
)
@pass_session
def subscribe(session: Session, name: str, patterns: tuple[str, ...], replace: bool) -> None:
    """Create a subscription, or add patterns to one.

    From now on the subscription NAME gets a copy of every message published to a topic
    matching one of PATTERNS. In a pattern, * matches one dotted segment and # matches
    zero or more.
    """
    created = session.broker().subscribe(name, list(patterns), replace=replace)
    click.echo(f"subscription {created.name}: {', '.join(created.patterns)}")


@click.command()
@click.argument("name")
@note_option
@pass_session
def pause(session: Session, name: str, note: str | None) -> None:
    """Pause the subscription NAME: no worker claims from it until it is resumed.

    Publishes are still accepted and queue up; handlers already running finish. The
    pause survives restarts and is recorded in the audit trail.
    """
    _set_paused(session, name, True, note)
    click.echo(f"paused subscription {name}")


@click.command()
@click.argument("name")
@note_option
@pass_session
def resume(session: Session, name: str, note: str | None) -> None:
    """Resume the subscription NAME: workers claim from it again."""
    _set_paused(session, name, False, note)
    click.echo(f"resumed subscription {name}")


def _set_paused(session: Session, name: str, paused: bool, note: str | None) -> None:
    broker = session.broker()
    (broker.pause if paused else broker.resume)(name, actor=cli_actor(), note=note)
