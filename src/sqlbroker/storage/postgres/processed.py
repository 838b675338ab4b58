"""PostgreSQL processed keys: see :mod:`sqlbroker.features.processed` for the contract."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlbroker.storage.postgres.connection import PostgresPool


class PostgresProcessed:
    """Processed-key operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _sql: dict[str, str]

    def _now_param(self) -> datetime | None:
        raise NotImplementedError

    def _processed_write(self, name: str, params: dict[str, Any]) -> int:
        with self._db.connection(write=True) as conn:
            return conn.execute(self._sql[name], {**params, "now": self._now_param()}).rowcount

    def processed_reserve(
        self, *, scope: str, key: str, token: str, lease: float, window: float
    ) -> str:
        params = {"scope": scope, "key": key, "now": self._now_param()}
        with self._db.connection(write=True) as conn:
            taken = conn.execute(
                self._sql["processed_reserve"],
                {**params, "token": token, "lease": lease, "window": window},
            ).fetchone()
            if taken is not None:
                return "reserved"
            row = conn.execute(self._sql["processed_get"], params).fetchone()
        # The holder may have let go between the two statements: call it busy, and the
        # caller's retry finds it free.
        return "done" if row is not None and row[0] == "done" else "busy"

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
