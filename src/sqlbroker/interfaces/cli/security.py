"""``sqlbroker roles`` (grant, show) and ``sqlbroker tenants`` (enable, disable, add,
remove, list, assign): least privilege and tenant isolation on PostgreSQL.

Both act on the schema of ``--schema`` (default: the connection's current schema) and need
the schema's owner (the migrator) or a superuser, except ``roles show`` and ``tenants list``.
See docs/security.md.
"""

from __future__ import annotations

import click

from sqlbroker.features import security
from sqlbroker.interfaces.cli.admin import broker_in, schema_option
from sqlbroker.interfaces.cli.params import json_option
from sqlbroker.interfaces.cli.render import echo_json, print_table, table
from sqlbroker.interfaces.cli.session import CliFailure, Session, pass_session

_schema_option = schema_option(
    "PostgreSQL schema of the sqlbroker tables (default: the current schema)."
)
_prefix_option = click.option(
    "--prefix",
    default=security.DEFAULT_ROLE_PREFIX,
    help="Group roles are PREFIX_migrator, PREFIX_producer, … (one set per deployment).",
)


def _print_grants(shown: dict[str, dict[str, str]], as_json: bool) -> None:
    if as_json:
        echo_json(shown)
        return
    rows = [
        (role, table_name, privileges)
        for role, tables in shown.items()
        for table_name, privileges in tables.items()
    ]
    print_table(table(None, ["role", "table", "privileges"], rows), empty="no grants")


@click.group()
def roles() -> None:
    """Least-privilege PostgreSQL group roles: grant them, show what they hold."""


@roles.command("grant")
@_schema_option
@_prefix_option
@click.option("--create", is_flag=True, help="Create missing group roles (needs CREATEROLE).")
@json_option()
@pass_session
def roles_grant(
    session: Session, pg_schema: str | None, prefix: str, create: bool, as_json: bool
) -> None:
    """Grant each group role exactly its privileges on the sqlbroker tables.

    Idempotent, and it revokes anything else the groups held on those tables: run it after
    every `sqlbroker migrate`, as the schema's owner. Login roles join a group with
    GRANT PREFIX_consumer TO app_worker (see docs/security.md).
    """
    broker = broker_in(session, pg_schema)
    _print_grants(security.grant_roles(broker.backend, prefix=prefix, create=create), as_json)


@roles.command("show")
@_schema_option
@_prefix_option
@json_option()
@pass_session
def roles_show(session: Session, pg_schema: str | None, prefix: str, as_json: bool) -> None:
    """Show the table privileges each group role holds (column grants not listed)."""
    broker = broker_in(session, pg_schema)
    _print_grants(security.show_roles(broker.backend, prefix=prefix), as_json)


@click.group()
def tenants() -> None:
    """Tenant isolation with row-level security (PostgreSQL)."""


@tenants.command("enable")
@_schema_option
@pass_session
def tenants_enable(session: Session, pg_schema: str | None) -> None:
    """Turn row-level security on: each login role bound to a tenant sees only its own."""
    security.enable_tenants(broker_in(session, pg_schema).backend)
    click.echo("tenant isolation is on")


@tenants.command("disable")
@_schema_option
@pass_session
def tenants_disable(session: Session, pg_schema: str | None) -> None:
    """Turn row-level security off (bindings and tenant columns are kept)."""
    security.disable_tenants(broker_in(session, pg_schema).backend)
    click.echo("tenant isolation is off")


@tenants.command("add")
@click.argument("tenant")
@click.option("--role", required=True, help="The existing login role that acts for TENANT.")
@_schema_option
@pass_session
def tenants_add(session: Session, tenant: str, role: str, pg_schema: str | None) -> None:
    """Bind the login role ROLE to TENANT (replacing an earlier binding)."""
    security.set_tenant_role(broker_in(session, pg_schema).backend, tenant=tenant, role=role)
    click.echo(f"role {role} acts for tenant {tenant}")


@tenants.command("remove")
@click.option("--role", required=True, help="The login role to unbind.")
@_schema_option
@pass_session
def tenants_remove(session: Session, role: str, pg_schema: str | None) -> None:
    """Unbind a login role from its tenant."""
    removed = security.remove_tenant_role(broker_in(session, pg_schema).backend, role=role)
    click.echo(f"role {role} unbound" if removed else f"role {role} was not bound")


@tenants.command("list")
@_schema_option
@json_option()
@pass_session
def tenants_list(session: Session, pg_schema: str | None, as_json: bool) -> None:
    """List the role → tenant bindings, and whether isolation is on."""
    backend = broker_in(session, pg_schema).backend
    bindings = security.tenants(backend)
    enabled = security.tenants_enabled(backend)
    if as_json:
        echo_json({"enabled": enabled, "roles": [[b.role, b.tenant] for b in bindings]})
        return
    click.echo(f"tenant isolation is {'on' if enabled else 'off'}")
    rows = [(binding.tenant, binding.role) for binding in bindings]
    print_table(table(None, ["tenant", "role"], rows), empty="no tenant roles")


@tenants.command("assign")
@click.argument("subscription")
@click.option("--tenant", help="The tenant (omit to make it no tenant's).")
@_schema_option
@pass_session
def tenants_assign(
    session: Session, subscription: str, tenant: str | None, pg_schema: str | None
) -> None:
    """Hand an existing subscription (with its messages) to a tenant."""
    backend = broker_in(session, pg_schema).backend
    if not security.assign_subscription(backend, subscription=subscription, tenant=tenant):
        raise CliFailure(f"no subscription {subscription!r}")
    click.echo(f"subscription {subscription} belongs to {tenant or 'no tenant'}")
