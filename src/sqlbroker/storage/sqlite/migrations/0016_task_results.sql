-- sqlbroker schema 16 (SQLite): results kept by a caller's key (docs/celery.md).
--
-- Celery's result backend keys a task's result by Celery's task id, not by sqlbroker's
-- message id, and keeps group results and chord counters next to them: a small key-value
-- table. Every row has an expiry (Celery's result_expires, or the broker's result_ttl when
-- Celery sets none): reads ignore an expired row and the reaper deletes it, so nothing is
-- kept without bound. ``value`` is NULL for a counter (a chord's, ``counter`` holds it).

CREATE TABLE sqlbroker_task_result (
    key        TEXT PRIMARY KEY,
    value      BLOB,
    counter    INTEGER NOT NULL DEFAULT 0,
    stored_at  REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX sqlbroker_task_result_expires ON sqlbroker_task_result (expires_at);
