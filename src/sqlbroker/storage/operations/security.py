"""Least-privilege roles and tenants (PostgreSQL; see docs/security.md and
:mod:`sqlbroker.features.security`, which validates every name first).

SQLite has no database roles and no row-level security: every operation here refuses
there (:func:`_roles_needed`), instead of pretending. Role and schema names never enter
statement text: they are bound parameters, and the grant block quotes them itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlbroker.core.errors import ConfigurationError, NotFound
from sqlbroker.storage.base import ROLE_GROUPS, TenantRole
from sqlbroker.storage.plan import Plan, atomic, changed, query, reads

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


def _roles_needed(settings: Settings, what: str) -> None:
    """Refuse where the database has no roles (SQLite)."""
    if not settings.roles:
        raise ConfigurationError(
            f"{what} needs PostgreSQL: SQLite has no database roles or row-level security, so"
            " anyone who can open the file can read and write every message (protect the"
            " file with filesystem permissions instead)"
        )


@atomic  # its settings must reach the grant: one transaction, one server session
def roles_grant(
    settings: Settings, *, prefix: str, create: bool
) -> Plan[dict[str, dict[str, str]]]:
    """Give the group roles ``<prefix>_<group>`` (``ROLE_GROUPS``) exactly their privileges
    on this schema's tables, revoking anything else they held there; with ``create``,
    create missing groups (NOLOGIN) first, else a missing one is a ``ConfigurationError``.
    Idempotent. Returns :func:`roles_show`."""
    _roles_needed(settings, "least-privilege roles")
    missing = yield query("roles_missing", groups=[f"{prefix}_{group}" for group in ROLE_GROUPS])
    if missing and not create:
        raise ConfigurationError(
            f"sqlbroker: the role {missing[0][0]} does not exist (create the group roles"
            " first, or grant with --create as a role allowed to create roles)"
        )
    yield query(
        "security_settings", prefix=prefix, schema=settings.schema, create="on" if create else "off"
    )
    yield query("roles_grant")
    return (yield from roles_show(settings, prefix=prefix))


@reads
def roles_show(settings: Settings, *, prefix: str) -> Plan[dict[str, dict[str, str]]]:
    """Role → table → privileges (``"DELETE, INSERT, SELECT"``) the groups hold."""
    _roles_needed(settings, "least-privilege roles")
    rows = yield query("roles_table_grants", schema=settings.schema, prefix=prefix)
    shown: dict[str, dict[str, str]] = {}
    for role, table, privileges in rows:
        shown.setdefault(role, {})[table] = privileges
    return shown


@reads
def roles_tables(settings: Settings) -> Plan[list[str]]:
    """The sqlbroker tables in this schema (what the grant matrix must cover)."""
    _roles_needed(settings, "least-privilege roles")
    rows = yield query("roles_tables", schema=settings.schema)
    return [row[0] for row in rows]


def tenant_enable(settings: Settings, *, enabled: bool) -> Plan[None]:
    """Turn row-level security for tenants on or off (the schema owner's DDL)."""
    _roles_needed(settings, "tenant isolation")
    yield query("tenants_enable" if enabled else "tenants_disable")


@reads
def tenant_enabled(settings: Settings) -> Plan[bool]:
    if not settings.roles:
        return False
    row = yield query("tenants_enabled")
    return bool(row and row[0][0])


@atomic
def tenant_set(settings: Settings, *, role: str, tenant: str) -> Plan[None]:
    """Map the login role ``role`` (it must exist) to ``tenant``; replaces a mapping. The
    look and the write are one transaction: a write that fails leaves nothing done."""
    _roles_needed(settings, "tenant isolation")
    row = yield query("tenant_role_exists", role=role)
    if not row or not row[0][0]:
        raise NotFound(f"no PostgreSQL role named {role!r}: create the login role first")
    yield query("tenant_set", role=role, tenant=tenant)


def tenant_remove(settings: Settings, *, role: str) -> Plan[bool]:
    _roles_needed(settings, "tenant isolation")
    return (yield from changed("tenant_remove", role=role))


@reads
def tenant_list(settings: Settings) -> Plan[list[TenantRole]]:
    """The mappings the caller may see (the owner: all; a tenant role: its own)."""
    _roles_needed(settings, "tenant isolation")
    rows = yield query("tenant_list")
    return [TenantRole(role=role, tenant=tenant) for role, tenant in rows]


def tenant_assign(settings: Settings, *, subscription: str, tenant: str | None) -> Plan[bool]:
    """Hand an existing subscription to ``tenant`` (``None``: to no tenant)."""
    _roles_needed(settings, "tenant isolation")
    row = yield query("tenant_assign", subscription=subscription, tenant=tenant)
    return bool(row and row[0][0])
