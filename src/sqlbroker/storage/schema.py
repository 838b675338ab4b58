"""The schema, written once for both dialects: numbered migrations, the version they
leave in ``sqlbroker_schema_version``, the check that a database is at the version this
sqlbroker needs, and the complete script a DBA applies by hand (``sqlbroker schema
--print``). A dialect supplies only its :class:`SchemaFiles` (dialect.py) and how a
migration script runs (its backend's ``_run_script``; the loop is ``Backend.migrate``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlbroker.core.errors import SchemaError
from sqlbroker.storage.sql import load_blocks, load_migrations, printed_schema

Migration = tuple[int, str, str]
"""``(version, name, script)`` of one ``NNNN_name.sql`` file."""


@dataclass(frozen=True, slots=True)
class SchemaFiles:
    """A dialect's schema: where its SQL and migrations live, and what to tell an operator
    whose database is behind."""

    package: str
    """The dialect's package (its ``queries.sql`` and ``migrations/``)."""
    label: str
    """The database's name in the printed script (``SQLite``, ``PostgreSQL``)."""
    migrate_hint: str
    """How to bring an old schema up to date."""

    def migrations(self, qualifier: str = "") -> list[Migration]:
        return load_migrations(f"{self.package}.migrations", schema=qualifier)

    def check(self, found: int) -> None:
        """Raise ``SchemaError`` unless ``found`` is exactly the version this code needs."""
        expected = len(self.migrations())
        if found != expected:
            raise SchemaError(
                f"the database schema is at version {found}, this sqlbroker needs {expected}:"
                + (f" {self.migrate_hint}" if found < expected else " upgrade sqlbroker")
            )

    def script(self, qualifier: str = "", preamble: Sequence[str] = ()) -> str:
        """The complete schema script, version rows included."""
        blocks = load_blocks(self.package, "queries.sql", schema=qualifier)
        return printed_schema(
            self.migrations(qualifier),
            backend=self.label,
            version_table=blocks["schema_version_table"],
            version_row=blocks["schema_version_printed"],
            preamble=preamble,
        )


def pending(migrations: Sequence[Migration], current: int) -> list[Migration]:
    """The migrations a database at version ``current`` lacks, in order."""
    return [migration for migration in migrations if migration[0] > current]
