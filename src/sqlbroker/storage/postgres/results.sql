-- Stored results (docs/results.md): the lookup by message id and the retention trim.

-- name: result_lookup
-- Every trace of the message's copies, one row each: still in the hot table (pending), a
-- stored value, a dead letter, an archive row. The caller picks, per subscription, what
-- the copy's result is (features/results.py). Each branch is an index probe on message_id.
SELECT subscription, 'pending' AS outcome, NULL::bytea AS value, NULL::text AS reason,
       NULL::text AS error_type, NULL::text AS error_message, NULL::text AS traceback,
       NULL::timestamptz AS finished_at
FROM {schema}sqlbroker_message WHERE message_id = %(message_id)s::uuid
UNION ALL
SELECT subscription, 'value', value, NULL, NULL, NULL, NULL, finished_at
FROM {schema}sqlbroker_result WHERE message_id = %(message_id)s::uuid
UNION ALL
SELECT subscription, 'dead', NULL, reason, error_type, error_message, traceback, dead_at
FROM {schema}sqlbroker_dead WHERE message_id = %(message_id)s::uuid
UNION ALL
SELECT subscription, outcome, NULL, NULL, NULL, NULL, NULL, finished_at
FROM {schema}sqlbroker_archive WHERE message_id = %(message_id)s::uuid

-- name: result_trim
-- Results older than the retention (``ttl`` seconds, by the database's clock), oldest first,
-- at most ``limit`` of them.
DELETE FROM {schema}sqlbroker_result
WHERE delivery_id = ANY (ARRAY(
    SELECT delivery_id FROM {schema}sqlbroker_result
    WHERE finished_at < coalesce(%(now)s::timestamptz, statement_timestamp())
                        - make_interval(secs => %(ttl)s)
    ORDER BY finished_at LIMIT %(limit)s
))

-- --- results by key (Celery's result backend; migrations/0016_task_results.sql) ----------

-- name: task_result_get_many
-- The unexpired values of ``keys`` (counters have none).
SELECT key, value FROM {schema}sqlbroker_task_result
WHERE key = ANY (%(keys)s::text[]) AND value IS NOT NULL
  AND expires_at > coalesce(%(now)s::timestamptz, statement_timestamp())

-- name: task_result_set
-- Store (or replace) the value of ``key``, kept ``ttl`` seconds; NOTIFY the result channel
-- with the key in the same commit, which wakes its waiters (storage/result_hub.py).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
stored AS (
    INSERT INTO {schema}sqlbroker_task_result AS r (key, value, counter, stored_at, expires_at)
    SELECT %(key)s, %(value)s, 0, t.now, t.now + make_interval(secs => %(ttl)s) FROM t
    ON CONFLICT (key, tenant) DO UPDATE SET
        value = excluded.value, stored_at = excluded.stored_at, expires_at = excluded.expires_at
    RETURNING key
)
SELECT count((SELECT pg_notify(%(result_channel)s, key))::text) AS n FROM stored

-- name: task_result_incr
-- Add one to the counter of ``key`` and return it; an absent or expired counter starts
-- again at 1, kept ``ttl`` seconds (an existing one keeps its expiry, as Redis's INCR does).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO {schema}sqlbroker_task_result AS r (key, value, counter, stored_at, expires_at)
SELECT %(key)s, NULL, 1, t.now, t.now + make_interval(secs => %(ttl)s) FROM t
ON CONFLICT (key, tenant) DO UPDATE SET
    counter = CASE WHEN r.expires_at > excluded.stored_at THEN r.counter + 1 ELSE 1 END,
    value = CASE WHEN r.expires_at > excluded.stored_at THEN r.value END,
    expires_at = CASE WHEN r.expires_at > excluded.stored_at THEN r.expires_at
                      ELSE excluded.expires_at END,
    stored_at = excluded.stored_at
RETURNING counter

-- name: task_result_expire
-- Keep the unexpired row of ``key`` ``ttl`` seconds from now.
UPDATE {schema}sqlbroker_task_result
SET expires_at = coalesce(%(now)s::timestamptz, statement_timestamp())
                 + make_interval(secs => %(ttl)s)
WHERE key = %(key)s AND expires_at > coalesce(%(now)s::timestamptz, statement_timestamp())

-- name: task_result_delete
DELETE FROM {schema}sqlbroker_task_result WHERE key = ANY (%(keys)s::text[])

-- name: task_result_trim
-- Expired rows, oldest first, at most ``limit`` of them.
DELETE FROM {schema}sqlbroker_task_result
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}sqlbroker_task_result
    WHERE expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
    ORDER BY expires_at LIMIT %(limit)s
))
