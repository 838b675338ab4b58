-- Stored results (docs/results.md): the values written with a complete, the lookup by
-- message id and the retention trim.

-- name: result_lookup
-- Every trace of the message's copies, one row each: still in the hot table (pending), a
-- stored value, a dead letter, an archive row. The caller picks, per subscription, what
-- the copy's result is (features/results.py). Each branch is an index probe on message_id.
SELECT subscription, 'pending' AS outcome, NULL AS value, NULL AS reason, NULL AS error_type,
       NULL AS error_message, NULL AS traceback, NULL AS finished_at
FROM sqlbroker_message WHERE message_id = :message_id
UNION ALL
SELECT subscription, 'value', value, NULL, NULL, NULL, NULL, finished_at
FROM sqlbroker_result WHERE message_id = :message_id
UNION ALL
SELECT subscription, 'dead', NULL, reason, error_type, error_message, traceback, dead_at
FROM sqlbroker_dead WHERE message_id = :message_id
UNION ALL
SELECT subscription, outcome, NULL, NULL, NULL, NULL, NULL, finished_at
FROM sqlbroker_archive WHERE message_id = :message_id

-- name: result_trim
-- Results older than the retention (``ttl`` seconds), oldest first, at most ``limit``.
DELETE FROM sqlbroker_result
WHERE delivery_id IN (
    SELECT delivery_id FROM sqlbroker_result WHERE finished_at < :now - :ttl
    ORDER BY finished_at LIMIT :limit
)

-- --- results by key (Celery's result backend; migrations/0016_task_results.sql) ----------

-- name: task_result_get_many
-- The unexpired values of ``keys`` (counters have none).
SELECT key, value FROM sqlbroker_task_result
WHERE key IN (SELECT value FROM json_each(:keys)) AND value IS NOT NULL AND expires_at > :now

-- name: task_result_set
-- Store (or replace) the value of ``key``, kept ``ttl`` seconds (its commit wakes the
-- change watcher, hence the waiters: there is no NOTIFY to send).
INSERT INTO sqlbroker_task_result AS r (key, value, counter, stored_at, expires_at)
VALUES (:key, :value, 0, :now, :now + :ttl)
ON CONFLICT (key) DO UPDATE SET
    value = excluded.value, stored_at = excluded.stored_at, expires_at = excluded.expires_at
RETURNING 1 AS n

-- name: task_result_incr
-- Add one to the counter of ``key`` and return it; an absent or expired counter starts
-- again at 1, kept ``ttl`` seconds (an existing one keeps its expiry, as Redis's INCR does).
INSERT INTO sqlbroker_task_result AS r (key, value, counter, stored_at, expires_at)
VALUES (:key, NULL, 1, :now, :now + :ttl)
ON CONFLICT (key) DO UPDATE SET
    counter = CASE WHEN r.expires_at > excluded.stored_at THEN r.counter + 1 ELSE 1 END,
    value = CASE WHEN r.expires_at > excluded.stored_at THEN r.value END,
    expires_at = CASE WHEN r.expires_at > excluded.stored_at THEN r.expires_at
                      ELSE excluded.expires_at END,
    stored_at = excluded.stored_at
RETURNING counter

-- name: task_result_expire
-- Keep the unexpired row of ``key`` ``ttl`` seconds from now.
UPDATE sqlbroker_task_result SET expires_at = :now + :ttl
WHERE key = :key AND expires_at > :now

-- name: task_result_delete
DELETE FROM sqlbroker_task_result WHERE key IN (SELECT value FROM json_each(:keys))

-- name: task_result_trim
-- Expired rows, oldest first, at most ``limit`` of them.
DELETE FROM sqlbroker_task_result
WHERE rowid IN (
    SELECT rowid FROM sqlbroker_task_result WHERE expires_at <= :now
    ORDER BY expires_at LIMIT :limit
)
