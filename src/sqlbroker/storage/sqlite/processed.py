"""SQLite processed keys: see :mod:`sqlbroker.features.processed` for the contract."""

from __future__ import annotations

from typing import Any

from sqlbroker.storage.sqlite.connection import SqlitePool


class SqliteProcessed:
    """Processed-key operations of :class:`SqliteBackend` (mixed into it)."""

    _db: SqlitePool
    _sql: dict[str, str]

    def _now(self) -> float:
        raise NotImplementedError

    def processed_reserve(
        self, *, scope: str, key: str, token: str, lease: float, window: float
    ) -> str:
        params = {"scope": scope, "key": key, "now": self._now()}
        with self._db.write() as conn:
            taken = conn.execute(
                self._sql["processed_reserve"],
                {**params, "token": token, "lease": lease, "window": window},
            ).fetchone()
            if taken is not None:
                return "reserved"
            row = conn.execute(self._sql["processed_get"], params).fetchone()
        return "done" if row is not None and row[0] == "done" else "busy"

    def _processed_write(self, name: str, params: dict[str, Any]) -> int:
        with self._db.write() as conn:
            return conn.execute(self._sql[name], {**params, "now": self._now()}).rowcount

    def processed_confirm(self, *, scope: str, key: str, token: str, window: float) -> bool:
        params = {"scope": scope, "key": key, "token": token, "window": window}
        return self._processed_write("processed_confirm", params) > 0

    def processed_extend(self, *, scope: str, key: str, token: str, lease: float) -> bool:
        params = {"scope": scope, "key": key, "token": token, "lease": lease}
        return self._processed_write("processed_extend", params) > 0

    def processed_release(self, *, scope: str, key: str, token: str) -> bool:
        params = {"scope": scope, "key": key, "token": token}
        return self._processed_write("processed_release", params) > 0

    def processed_forget(self, *, scope: str, key: str) -> bool:
        return self._processed_write("processed_forget", {"scope": scope, "key": key}) > 0

    def processed_trim(self, *, limit: int) -> int:
        return self._processed_write("processed_trim", {"limit": limit})
