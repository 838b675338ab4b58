"""PostgreSQL saga state: see :mod:`sqlbroker.features.sagas` for the contract."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlbroker.core.sagas import DueSaga, NewSaga, SagaInstance
from sqlbroker.storage.postgres.connection import Conn, PostgresPool
from sqlbroker.storage.saga_rows import saga_of


class PostgresSagas:
    """Saga operations of :class:`PostgresBackend` (mixed into it)."""

    _db: PostgresPool
    _sql: dict[str, str]

    def _now_param(self) -> datetime | None:
        raise NotImplementedError

    @contextmanager
    def _saga_conn(self, conn: Any, *, write: bool) -> Iterator[Conn]:
        if conn is None and not write:
            with self._db.connection(write=False) as own:
                yield own
        else:
            with self._db.transaction(conn) as joined:
                yield joined

    def saga_insert(self, *, saga: NewSaga, conn: Any = None) -> bool:
        params = {
            "id": saga.id,
            "name": saga.name,
            "data": saga.data,
            "timeout": saga.timeout,
            "now": self._now_param(),
        }
        with self._saga_conn(conn, write=True) as c:
            if c.execute(self._sql["saga_insert"], params).fetchone() is None:
                return False
            with c.cursor() as cursor:
                cursor.executemany(
                    self._sql["saga_step_insert"],
                    [
                        {"saga_id": saga.id, "idx": idx, "name": name, "compensate": comp}
                        for idx, (name, comp) in enumerate(saga.steps)
                    ],
                )
        return True

    def saga_get(
        self, *, id: str, steps: bool = True, lock: bool = False, conn: Any = None
    ) -> SagaInstance | None:
        with self._saga_conn(conn, write=lock) as c:
            row = c.execute(self._sql["saga_lock" if lock else "saga_get"], {"id": id}).fetchone()
            if row is None:
                return None
            step_rows = (
                c.execute(self._sql["saga_steps_get"], {"id": id}).fetchall() if steps else []
            )
        return saga_of(row, step_rows)

    def saga_update(
        self,
        *,
        id: str,
        version: int,
        status: str,
        step: int,
        error: str | None,
        message_id: str | None,
        restart_deadline: bool = False,
        conn: Any = None,
    ) -> bool:
        params = {
            "id": id,
            "version": version,
            "status": status,
            "step": step,
            "error": error,
            "message_id": message_id,
            "restart_deadline": restart_deadline,
            "now": self._now_param(),
        }
        with self._saga_conn(conn, write=True) as c:
            return c.execute(self._sql["saga_update"], params).rowcount > 0

    def saga_step_update(
        self,
        *,
        saga_id: str,
        index: int,
        status: str,
        attempts: int = 0,
        output: str | None = None,
        error: str | None = None,
        conn: Any = None,
    ) -> bool:
        params = {
            "saga_id": saga_id,
            "idx": index,
            "status": status,
            "attempts": attempts,
            "output": output,
            "error": error,
            "now": self._now_param(),
        }
        with self._saga_conn(conn, write=True) as c:
            return c.execute(self._sql["saga_step_update"], params).rowcount > 0

    def saga_list(self, *, name: str | None, status: str | None, limit: int) -> list[SagaInstance]:
        params = {"name": name, "status": status, "limit": limit}
        with self._saga_conn(None, write=False) as c:
            return [saga_of(row) for row in c.execute(self._sql["saga_list"], params)]

    def saga_due(self, *, limit: int) -> list[DueSaga]:
        params = {"now": self._now_param(), "limit": limit}
        with self._saga_conn(None, write=False) as c:
            rows = c.execute(self._sql["saga_due"], params).fetchall()
        return [
            DueSaga(id=row[0], version=int(row[1]), expired=bool(row[2]), dead_reason=row[3])
            for row in rows
        ]

    def saga_counts(self) -> dict[str, int]:
        with self._saga_conn(None, write=False) as c:
            return {row[0]: int(row[1]) for row in c.execute(self._sql["saga_counts"])}
