"""SQLite has no database roles and no row-level security: the security operations of the
storage seam refuse clearly instead of pretending (see docs/security.md)."""

from __future__ import annotations

from typing import NoReturn

from sqlbroker.core.errors import ConfigurationError
from sqlbroker.storage.base import TenantRole


def _refuse(what: str) -> NoReturn:
    raise ConfigurationError(
        f"{what} needs PostgreSQL: SQLite has no database roles or row-level security, so"
        " anyone who can open the file can read and write every message (protect the file"
        " with filesystem permissions instead)"
    )


class SqliteSecurity:
    """Roles and tenants of :class:`SqliteBackend` (mixed into it): all refused."""

    def roles_grant(self, *, prefix: str, create: bool) -> dict[str, dict[str, str]]:
        _refuse("least-privilege roles")

    def roles_show(self, *, prefix: str) -> dict[str, dict[str, str]]:
        _refuse("least-privilege roles")

    def tenant_enable(self, *, enabled: bool) -> None:
        _refuse("tenant isolation")

    def tenant_enabled(self) -> bool:
        return False

    def tenant_set(self, *, role: str, tenant: str) -> None:
        _refuse("tenant isolation")

    def tenant_remove(self, *, role: str) -> bool:
        _refuse("tenant isolation")

    def tenant_list(self) -> list[TenantRole]:
        _refuse("tenant isolation")

    def tenant_assign(self, *, subscription: str, tenant: str | None) -> bool:
        _refuse("tenant isolation")
