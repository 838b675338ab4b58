"""Least-privilege roles and tenant isolation (PostgreSQL): the admin operations.

``grant_roles`` gives the group roles ``<prefix>_migrator``, ``_producer``, ``_consumer``,
``_reader`` and ``_operator`` exactly the privileges their jobs need on the sqlbroker tables
(see docs/security.md for the matrix); run it after every ``migrate``. The tenant
operations bind login roles to tenants and turn row-level security on or off. Every name is
validated here, identically for both backends, before any SQL; SQLite refuses the whole
module with ``ConfigurationError``.
"""

from __future__ import annotations

import re

from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.topics import SEGMENT, validate_topic
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.base import ROLE_GROUPS, TenantRole

__all__ = [
    "DEFAULT_ROLE_PREFIX",
    "ROLE_GROUPS",
    "assign_subscription",
    "disable_tenants",
    "enable_tenants",
    "grant_roles",
    "remove_tenant_role",
    "role_names",
    "set_tenant_role",
    "show_roles",
    "tenants",
    "tenants_enabled",
]

DEFAULT_ROLE_PREFIX = "sqlbroker"
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,39}")
_MAX_ROLE = 63


def _prefix(value: object) -> str:
    if not isinstance(value, str) or not _PREFIX.fullmatch(value):
        raise InvalidOption(
            "prefix", "must be a lowercase identifier ([a-z_][a-z0-9_]*, at most 40 characters)"
        )
    return value


def _tenant(value: object) -> str:
    if not isinstance(value, str) or not SEGMENT.fullmatch(value):
        raise InvalidOption("tenant", "must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'")
    return value


def _role(value: object) -> str:
    if (
        not isinstance(value, str)
        or not value
        or not value.isprintable()  # NUL and lone surrogates included
        or len(value.encode()) > _MAX_ROLE
    ):
        raise InvalidOption("role", "must be a PostgreSQL role name (1 to 63 bytes, printable)")
    return value


def role_names(prefix: str = DEFAULT_ROLE_PREFIX) -> dict[str, str]:
    """Group → role name, e.g. ``{"producer": "sqlbroker_producer", …}``."""
    checked = _prefix(prefix)
    return {group: f"{checked}_{group}" for group in ROLE_GROUPS}


def grant_roles(
    backend: Backend, *, prefix: str = DEFAULT_ROLE_PREFIX, create: bool = False
) -> dict[str, dict[str, str]]:
    """Grant the group roles their privileges on the backend's schema; idempotent.

    Runs as the schema's owner (the migrator) or a superuser. With ``create``, missing
    group roles are created first (that needs CREATEROLE); otherwise a missing one is a
    ``ConfigurationError``. Returns role → table → privileges, as :func:`show_roles`.
    """
    return backend.roles_grant(prefix=_prefix(prefix), create=bool(create))


def show_roles(backend: Backend, *, prefix: str = DEFAULT_ROLE_PREFIX) -> dict[str, dict[str, str]]:
    """Role → table → privileges that the group roles hold on the schema's tables."""
    return backend.roles_show(prefix=_prefix(prefix))


def enable_tenants(backend: Backend) -> None:
    """Turn row-level security on: from now on a login role mapped to a tenant sees and
    touches only its tenant's subscriptions, messages, dead letters, archive, metrics,
    schedules, sagas, processed keys, worker heartbeats and audit entries (see
    docs/security.md for the full list). Needs the schema's owner."""
    backend.tenant_enable(enabled=True)


def disable_tenants(backend: Backend) -> None:
    """Turn row-level security off again (mappings and tenant columns are kept)."""
    backend.tenant_enable(enabled=False)


def tenants_enabled(backend: Backend) -> bool:
    return backend.tenant_enabled()


def set_tenant_role(backend: Backend, *, tenant: str, role: str) -> None:
    """Bind the existing login role ``role`` to ``tenant`` (replacing an earlier binding)."""
    backend.tenant_set(role=_role(role), tenant=_tenant(tenant))


def remove_tenant_role(backend: Backend, *, role: str) -> bool:
    """Unbind ``role``; it then sees only rows of no tenant. Returns whether it was bound."""
    return backend.tenant_remove(role=_role(role))


def tenants(backend: Backend) -> list[TenantRole]:
    """The role → tenant bindings the caller may see."""
    return backend.tenant_list()


def assign_subscription(backend: Backend, *, subscription: str, tenant: str | None) -> bool:
    """Hand an existing subscription (one created before tenants were enabled, or by an
    unbound role) to ``tenant``, or to no tenant with ``None``, with its messages and its
    tenant's dead letters, archive rows, stored results and metrics under that name, and
    the Celery results of the Celery tasks it holds: the previous tenant loses them all (an
    earlier holder of the name keeps what it left). Returns whether it exists."""
    validate_topic(subscription, "subscription")
    return backend.tenant_assign(
        subscription=subscription, tenant=None if tenant is None else _tenant(tenant)
    )
