"""PostgreSQL retention: per-subscription times, the archive's daily partitions, and the
bounded deletes of rows past their time (the SQL lives in ``retention.sql``; the partition
function in migration 13).

Mixed into :class:`~sqlbroker.storage.postgres.backend.PostgresBackend`."""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

from sqlbroker.storage.base import RetentionBounds
from sqlbroker.storage.postgres.connection import PostgresPool
from sqlbroker.storage.sql import load_blocks


class PostgresRetention:
    """Retention operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _qualifier: str

    def _now_param(self) -> datetime | None:
        raise NotImplementedError

    @cached_property
    def _retention_sql(self) -> dict[str, str]:
        return load_blocks("sqlbroker.storage.postgres", "retention.sql", schema=self._qualifier)

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
        with self._db.connection(write=True) as conn:
            return conn.execute(self._retention_sql["retention_set"], params).rowcount > 0

    def retention_list(self, *, name: str | None) -> list[tuple[str, float | None, float | None]]:
        with self._db.connection(write=False) as conn:
            rows = conn.execute(self._retention_sql["retention_list"], {"name": name}).fetchall()
        return [(str(row[0]), row[1], row[2]) for row in rows]

    def retention_bounds(self) -> RetentionBounds:
        with self._db.connection(write=False) as conn:
            row = conn.execute(self._retention_sql["retention_bounds"]).fetchone()
        assert row is not None
        return RetentionBounds(*row)

    def archive_partitions_maintain(self, *, ahead: int, keep: float) -> tuple[int, int]:
        params = {"now": self._now_param(), "ahead": ahead, "keep": keep}
        with self._db.connection(write=True) as conn:
            sql = self._retention_sql["archive_partitions_maintain"]
            row = conn.execute(sql, params).fetchone()
        assert row is not None
        created, dropped = row[0]
        return int(created), int(dropped)

    def _retention_delete(self, name: str, params: dict[str, Any]) -> int:
        with self._db.connection(write=True) as conn:
            sql = self._retention_sql[name]
            return max(0, conn.execute(sql, {**params, "now": self._now_param()}).rowcount)

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
