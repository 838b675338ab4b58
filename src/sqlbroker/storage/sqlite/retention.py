"""SQLite retention: per-subscription times and the bounded deletes of rows past their time
(the SQL lives in ``retention.sql``). SQLite has no partitions: everything is a row delete.

Mixed into :class:`~sqlbroker.storage.sqlite.backend.SqliteBackend`."""

from __future__ import annotations

from typing import Any

from sqlbroker.storage.base import RetentionBounds
from sqlbroker.storage.sql import load_blocks
from sqlbroker.storage.sqlite.connection import SqlitePool

_SQL = load_blocks("sqlbroker.storage.sqlite", "retention.sql")


class SqliteRetention:
    """Retention operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool

    def _now(self) -> float:
        raise NotImplementedError

    def retention_set(
        self,
        *,
        name: str,
        archive: float | None,
        dead: float | None,
        change_archive: bool,
        change_dead: bool,
    ) -> bool:
        params = {
            "name": name,
            "archive": archive,
            "dead": dead,
            "change_archive": change_archive,
            "change_dead": change_dead,
        }
        with self._db.write() as conn:
            return conn.execute(_SQL["retention_set"], params).rowcount > 0

    def retention_list(self, *, name: str | None) -> list[tuple[str, float | None, float | None]]:
        with self._db.read() as conn:
            rows = conn.execute(_SQL["retention_list"], {"name": name}).fetchall()
        return [(str(row[0]), _seconds(row[1]), _seconds(row[2])) for row in rows]

    def retention_bounds(self) -> RetentionBounds:
        with self._db.read() as conn:
            row = conn.execute(_SQL["retention_bounds"]).fetchone()
        return RetentionBounds(*(_seconds(value) for value in row))

    def archive_partitions_maintain(self, *, ahead: int, keep: float) -> tuple[int, int]:
        """Nothing to do: the SQLite archive is one table."""
        return 0, 0

    def _retention_delete(self, name: str, params: dict[str, Any]) -> int:
        with self._db.write() as conn:
            return max(0, conn.execute(_SQL[name], {**params, "now": self._now()}).rowcount)

    def archive_trim(self, *, keep: float, limit: int) -> int:
        return self._retention_delete("archive_trim_before", {"keep": keep, "limit": limit})

    def archive_trim_shorter(self, *, keep: float, longest: float, limit: int) -> int:
        params = {"keep": keep, "longest": longest, "limit": limit}
        return self._retention_delete("archive_trim_shorter", params)

    def dead_trim(self, *, keep: float, limit: int) -> int:
        return self._retention_delete("dead_trim_before", {"keep": keep, "limit": limit})

    def dead_trim_shorter(self, *, keep: float, longest: float, limit: int) -> int:
        params = {"keep": keep, "longest": longest, "limit": limit}
        return self._retention_delete("dead_trim_shorter", params)


def _seconds(value: object) -> float | None:
    """A stored retention, or ``None`` (the default) for NULL or a damaged value."""
    return float(value) if isinstance(value, int | float) and value > 0 else None
