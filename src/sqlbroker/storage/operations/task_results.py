"""Results by key: the key-value store of Celery's result backend
(:mod:`sqlbroker.contrib.celery.results`; migrations 0016).

Celery keys a task's result by its task id (``celery-task-meta-<id>``), and keeps group
results and chord counters beside them. Every row expires (``ttl`` seconds after it was
written or last given a new expiry): reads ignore expired rows and :func:`task_result_trim`
deletes them. Storing a value wakes the waiters of its key (``result_watch(message_id=key)``):
PostgreSQL NOTIFYs the result channel in the same commit, SQLite's watcher sees the commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlbroker.storage.plan import Plan, changed, changed_count, query, reads

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


@reads
def task_result_get_many(settings: Settings, *, keys: list[str]) -> Plan[dict[str, bytes]]:
    """The stored, unexpired values of ``keys`` (absent keys are left out)."""
    rows = yield query("task_result_get_many", keys=list(keys))
    return {row[0]: bytes(row[1]) for row in rows}


def task_result_set(settings: Settings, *, key: str, value: bytes, ttl: float) -> Plan[None]:
    """Store ``value`` under ``key`` (replacing any), kept ``ttl`` seconds."""
    yield query(
        "task_result_set", key=key, value=value, ttl=ttl, result_channel=settings.result_channel
    )


def task_result_incr(settings: Settings, *, key: str, ttl: float) -> Plan[int]:
    """Add one to the counter ``key`` and return its new value; a new counter is kept ``ttl``
    seconds."""
    rows = yield query("task_result_incr", key=key, ttl=ttl)
    return int(rows[0][0])


def task_result_expire(settings: Settings, *, key: str, ttl: float) -> Plan[bool]:
    """Keep ``key`` ``ttl`` seconds from now; False when there is no such unexpired key."""
    return changed("task_result_expire", key=key, ttl=ttl)


def task_result_delete(settings: Settings, *, keys: list[str]) -> Plan[int]:
    """Delete ``keys``; return how many existed."""
    return changed_count("task_result_delete", keys=list(keys))


def task_result_trim(settings: Settings, *, limit: int) -> Plan[int]:
    """Delete up to ``limit`` expired rows; return how many."""
    return changed_count("task_result_trim", limit=limit)
