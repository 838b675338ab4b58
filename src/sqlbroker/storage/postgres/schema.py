"""The PostgreSQL schema: migrations, the version check and the DDL for a DBA.

Kept apart from the hot-path queue operations in :mod:`backend`, whose class mixes this in."""

from __future__ import annotations

import re

import psycopg.errors
from psycopg import sql

from sqlbroker.core.errors import InvalidOption, SchemaError
from sqlbroker.storage.postgres.connection import Conn, PostgresPool
from sqlbroker.storage.sql import load_blocks, load_migrations, printed_schema
from sqlbroker.storage.url import redact

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MIGRATIONS = "sqlbroker.storage.postgres.migrations"


def qualifier(schema: str | None) -> str:
    """The prefix naming ``schema`` in SQL (``"name".``; empty for the search path)."""
    if schema is None:
        return ""
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise InvalidOption(
            "schema", "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63)"
        )
    return f'"{schema}".'


class PostgresSchema:
    """Schema operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _sql: dict[str, str]
    _schema: str | None
    _qualifier: str

    def migrate(self) -> list[int]:
        migrations = load_migrations(_MIGRATIONS, schema=self._qualifier)
        # A runtime role (no DDL rights) may call this too, e.g. Broker(migrate=True): on a
        # current schema it must stay a read, so look before taking the lock.
        if self.schema_version() >= len(migrations):
            return []
        applied: list[int] = []
        with self._db.connection(write=True, watched=False) as conn:
            try:
                with conn.transaction():
                    conn.execute(self._sql["untimed"])  # DDL may wait and run long
                    # Serialize concurrent migrators: the second waits, then finds nothing.
                    conn.execute(self._sql["migrate_lock"])
                    # CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when
                    # the schema exists, which a migrator owning just its schema lacks.
                    if self._schema is not None and not self._schema_exists(conn):
                        conn.execute(
                            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                                sql.Identifier(self._schema)
                            )
                        )
                    conn.execute(self._sql["schema_version_table"])
                    row = conn.execute(self._sql["schema_version"]).fetchone()
                    current = int(row[0]) if row else 0
                    for version, name, script in migrations:
                        if version <= current:
                            continue
                        conn.execute(script.encode())
                        conn.execute(
                            self._sql["schema_version_insert"], {"version": version, "name": name}
                        )
                        applied.append(version)
            except psycopg.errors.InsufficientPrivilege as error:
                raise SchemaError(
                    f"the schema needs migrating (to version {len(migrations)}) but this role"
                    f" may not change it ({redact(str(error)).strip().splitlines()[0]}): run"
                    " `sqlbroker migrate` as the migrator role (see docs/security.md)"
                ) from None
        return applied

    def _schema_exists(self, conn: Conn) -> bool:
        row = conn.execute(self._sql["schema_exists"], {"schema": self._schema}).fetchone()
        return bool(row and row[0])

    def schema_version(self) -> int:
        with self._db.connection(write=False) as conn:
            table = f"{self._qualifier}sqlbroker_schema_version"
            row = conn.execute(self._sql["schema_version_exists"], {"table": table}).fetchone()
            if not row or not row[0]:
                return 0
            row = conn.execute(self._sql["schema_version"]).fetchone()
        return int(row[0]) if row else 0

    def check_schema(self) -> None:
        expected = len(load_migrations(_MIGRATIONS))
        found = self.schema_version()
        if found != expected:
            raise SchemaError(
                f"the database schema is at version {found}, this sqlbroker needs {expected}:"
                + (
                    " run `sqlbroker migrate` as the migrator role (the schema's owner)"
                    if found < expected
                    else " upgrade sqlbroker"
                )
            )

    @staticmethod
    def schema_sql(schema: str | None = None) -> str:
        """The complete schema script, version rows included (``sqlbroker schema --print``),
        its tables in ``schema`` when given."""
        prefix = qualifier(schema)
        blocks = load_blocks("sqlbroker.storage.postgres", "queries.sql", schema=prefix)
        return printed_schema(
            load_migrations(_MIGRATIONS, schema=prefix),
            backend="PostgreSQL",
            version_table=blocks["schema_version_table"],
            version_row=blocks["schema_version_printed"],
            preamble=[f"CREATE SCHEMA IF NOT EXISTS {prefix[:-1]};"] if schema else [],
        )
