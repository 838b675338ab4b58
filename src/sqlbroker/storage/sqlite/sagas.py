"""SQLite saga state: see :mod:`sqlbroker.features.sagas` for the contract."""

from __future__ import annotations

from typing import Any

from sqlbroker.core.sagas import DueSaga, NewSaga, SagaInstance
from sqlbroker.storage.saga_rows import saga_of
from sqlbroker.storage.sqlite.connection import SqlitePool


class SqliteSagas:
    """Saga operations of :class:`SqliteBackend` (mixed into it).

    Every write runs in ``BEGIN IMMEDIATE`` (or the caller's transaction, which holds the
    file's write lock), so a saga read inside it cannot change under the reader: the
    ``lock`` flag of :meth:`saga_get` needs no statement of its own here."""

    _db: SqlitePool
    _sql: dict[str, str]

    def _now(self) -> float:
        raise NotImplementedError

    def saga_insert(self, *, saga: NewSaga, conn: Any = None) -> bool:
        now = self._now()
        with self._db.write(conn) as c:
            created = c.execute(
                self._sql["saga_insert"],
                {
                    "id": saga.id,
                    "name": saga.name,
                    "data": saga.data,
                    "timeout": saga.timeout,
                    "now": now,
                },
            ).fetchone()
            if created is None:
                return False
            c.executemany(
                self._sql["saga_step_insert"],
                [
                    {"saga_id": saga.id, "idx": idx, "name": name, "compensate": int(comp)}
                    for idx, (name, comp) in enumerate(saga.steps)
                ],
            )
        return True

    def saga_get(
        self, *, id: str, steps: bool = True, lock: bool = False, conn: Any = None
    ) -> SagaInstance | None:
        del lock
        if conn is None:
            with self._db.read() as c:
                return self._saga_read(c, id, steps)
        with self._db.write(conn) as c:
            return self._saga_read(c, id, steps)

    def _saga_read(self, c: Any, id: str, steps: bool) -> SagaInstance | None:
        row = c.execute(self._sql["saga_get"], {"id": id}).fetchone()
        if row is None:
            return None
        step_rows = c.execute(self._sql["saga_steps_get"], {"id": id}).fetchall() if steps else []
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
            "restart_deadline": int(restart_deadline),
            "now": self._now(),
        }
        with self._db.write(conn) as c:
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
            "now": self._now(),
        }
        with self._db.write(conn) as c:
            return c.execute(self._sql["saga_step_update"], params).rowcount > 0

    def saga_list(self, *, name: str | None, status: str | None, limit: int) -> list[SagaInstance]:
        params = {"name": name, "status": status, "limit": limit}
        with self._db.read() as c:
            return [saga_of(row) for row in c.execute(self._sql["saga_list"], params)]

    def saga_due(self, *, limit: int) -> list[DueSaga]:
        with self._db.read() as c:
            rows = c.execute(self._sql["saga_due"], {"now": self._now(), "limit": limit})
            return [
                DueSaga(id=row[0], version=int(row[1]), expired=bool(row[2]), dead_reason=row[3])
                for row in rows
            ]

    def saga_counts(self) -> dict[str, int]:
        with self._db.read() as c:
            return {row[0]: int(row[1]) for row in c.execute(self._sql["saga_counts"])}
