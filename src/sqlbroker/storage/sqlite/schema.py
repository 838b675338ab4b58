"""SQLite schema: the numbered migrations, their version and the check that the database
is at the version this sqlbroker needs."""

from __future__ import annotations

from collections.abc import Callable

from sqlbroker.core.errors import SchemaError
from sqlbroker.storage.sql import load_blocks, load_migrations, printed_schema
from sqlbroker.storage.sqlite.connection import SqlitePool, split_script


class SqliteSchema:
    """Schema operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool
    _sql: dict[str, str]

    _now: Callable[[], float]

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._db.write() as conn:
            conn.execute(self._sql["schema_version_table"])
            current = conn.execute(self._sql["schema_version"]).fetchone()[0]
            for version, name, script in load_migrations("sqlbroker.storage.sqlite.migrations"):
                if version <= current:
                    continue
                for statement in split_script(script):
                    conn.execute(statement)
                conn.execute(
                    self._sql["schema_version_insert"],
                    {"version": version, "name": name, "now": self._now()},
                )
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        with self._db.read() as conn:
            if not conn.execute(self._sql["schema_version_exists"]).fetchone()[0]:
                return 0
            return int(conn.execute(self._sql["schema_version"]).fetchone()[0])

    def check_schema(self) -> None:
        expected = len(load_migrations("sqlbroker.storage.sqlite.migrations"))
        found = self.schema_version()
        if found != expected:
            raise SchemaError(
                f"the database schema is at version {found}, this sqlbroker needs {expected}:"
                + (" run `sqlbroker migrate`" if found < expected else " upgrade sqlbroker")
            )

    @staticmethod
    def schema_sql() -> str:
        """The complete schema script, version rows included (``sqlbroker schema --print``)."""
        blocks = load_blocks("sqlbroker.storage.sqlite", "queries.sql")
        return printed_schema(
            load_migrations("sqlbroker.storage.sqlite.migrations"),
            backend="SQLite",
            version_table=blocks["schema_version_table"],
            version_row=blocks["schema_version_printed"],
        )
