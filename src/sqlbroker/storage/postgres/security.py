"""PostgreSQL least-privilege roles and tenants, mixed into :class:`PostgresBackend`.

Role and schema names never enter statement text: :data:`security_settings` passes them as
bound parameters into transaction-local settings, and the grant block quotes them itself.
"""

from __future__ import annotations

import functools

import psycopg.errors

from sqlbroker.core.errors import ConfigurationError, NotFound
from sqlbroker.storage.base import TenantRole
from sqlbroker.storage.postgres.connection import Conn, PostgresPool
from sqlbroker.storage.sql import load_blocks
from sqlbroker.storage.url import redact


class PostgresSecurity:
    """Roles and tenants of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _qualifier: str
    _schema: str | None

    @functools.cached_property
    def _security_sql(self) -> dict[str, str]:
        return load_blocks("sqlbroker.storage.postgres", "security.sql", schema=self._qualifier)

    def roles_grant(self, *, prefix: str, create: bool) -> dict[str, dict[str, str]]:
        sql = self._security_sql
        with self._db.connection(write=True) as conn:
            try:
                with conn.transaction():
                    self._settings(conn, prefix=prefix, create=create)
                    conn.execute(sql["roles_grant"])
            except psycopg.errors.UndefinedObject as error:
                raise ConfigurationError(_first_line(error)) from None
            except psycopg.errors.UndefinedTable as error:
                raise ConfigurationError(_first_line(error) + "; run `sqlbroker migrate`") from None
        return self.roles_show(prefix=prefix)

    def roles_show(self, *, prefix: str) -> dict[str, dict[str, str]]:
        shown: dict[str, dict[str, str]] = {}
        with self._db.connection(write=False) as conn:
            rows = conn.execute(
                self._security_sql["roles_table_grants"],
                {"schema": self._schema, "prefix": prefix},
            ).fetchall()
        for role, table, privileges in rows:
            shown.setdefault(role, {})[table] = privileges
        return shown

    def roles_tables(self) -> list[str]:
        """The sqlbroker tables in this schema (what the grant matrix must cover)."""
        with self._db.connection(write=False) as conn:
            rows = conn.execute(
                self._security_sql["roles_tables"], {"schema": self._schema}
            ).fetchall()
        return [row[0] for row in rows]

    def _settings(self, conn: Conn, *, prefix: str, create: bool) -> None:
        conn.execute(
            self._security_sql["security_settings"],
            {"prefix": prefix, "schema": self._schema, "create": "on" if create else "off"},
        )

    def tenant_enable(self, *, enabled: bool) -> None:
        with self._db.connection(write=True) as conn, conn.transaction():
            conn.execute(self._security_sql["tenants_enable" if enabled else "tenants_disable"])

    def tenant_enabled(self) -> bool:
        with self._db.connection(write=False) as conn:
            row = conn.execute(
                self._security_sql["tenants_enabled"],
                {"table": f"{self._qualifier}sqlbroker_message"},
            ).fetchone()
        return bool(row and row[0])

    def tenant_set(self, *, role: str, tenant: str) -> None:
        sql = self._security_sql
        with self._db.connection(write=True) as conn:
            row = conn.execute(sql["tenant_role_exists"], {"role": role}).fetchone()
            if not row or not row[0]:
                raise NotFound(f"no PostgreSQL role named {role!r}: create the login role first")
            conn.execute(sql["tenant_set"], {"role": role, "tenant": tenant})

    def tenant_remove(self, *, role: str) -> bool:
        with self._db.connection(write=True) as conn:
            return conn.execute(self._security_sql["tenant_remove"], {"role": role}).rowcount > 0

    def tenant_list(self) -> list[TenantRole]:
        with self._db.connection(write=False) as conn:
            rows = conn.execute(self._security_sql["tenant_list"]).fetchall()
        return [TenantRole(role=role, tenant=tenant) for role, tenant in rows]

    def tenant_assign(self, *, subscription: str, tenant: str | None) -> bool:
        with self._db.connection(write=True) as conn:
            row = conn.execute(
                self._security_sql["tenant_assign"],
                {"subscription": subscription, "tenant": tenant},
            ).fetchone()
            return bool(row and row[0])


def _first_line(error: psycopg.Error) -> str:
    text = redact(str(error)).strip()
    return text.splitlines()[0] if text else type(error).__name__
