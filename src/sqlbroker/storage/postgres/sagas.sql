-- Sagas (see migrations/0003_sagas.sql).
-- %(now)s is NULL unless a test clock overrides the database clock.

-- name: saga_insert
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO {schema}sqlbroker_saga
    (id, name, status, data, step, version, error, message_id, timeout,
     created_at, updated_at, deadline, finished_at)
SELECT %(id)s, %(name)s, 'running', %(data)s::jsonb, 0, 1, NULL, NULL, %(timeout)s,
       t.now, t.now, t.now + make_interval(secs => %(timeout)s), NULL
FROM t
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: saga_steps_insert
-- %(names)s and %(compensate)s are arrays of the same length, in step order.
INSERT INTO {schema}sqlbroker_saga_step (saga_id, idx, name, compensate, status)
SELECT %(saga_id)s, s.idx - 1, s.name, s.compensate, 'pending'
FROM unnest(%(names)s::text[], %(compensate)s::boolean[])
     WITH ORDINALITY AS s(name, compensate, idx)

-- name: saga_rows
-- (A fragment, included below.) A saga's columns, read by name (operations/sagas.py).
SELECT id, name, status, data::text, step, version, error, message_id::text,
       created_at, updated_at, deadline, finished_at
FROM {schema}sqlbroker_saga

-- name: saga_get
-- include: saga_rows
WHERE id = %(id)s

-- name: saga_lock
-- Transitions read the saga under a row lock, so that two never interleave.
-- include: saga_get
FOR UPDATE

-- name: saga_steps_get
SELECT idx, name, compensate, status, attempts, output::text, error,
       started_at, finished_at, compensated_at
FROM {schema}sqlbroker_saga_step WHERE saga_id = %(id)s ORDER BY idx

-- name: saga_update
-- A compare-and-set on the version read under the row lock.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE {schema}sqlbroker_saga s
SET status = %(status)s, step = %(step)s, version = s.version + 1, error = %(error)s,
    message_id = %(message_id)s::uuid, updated_at = t.now,
    deadline = CASE
        WHEN %(status)s NOT IN ('running', 'compensating') THEN NULL
        WHEN %(restart_deadline)s THEN t.now + make_interval(secs => s.timeout)
        ELSE s.deadline END,
    finished_at = CASE WHEN %(status)s IN ('running', 'compensating') THEN NULL
                       ELSE t.now END
FROM t
WHERE s.id = %(id)s AND s.version = %(version)s

-- name: saga_step_update
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE {schema}sqlbroker_saga_step p
SET status = %(status)s,
    attempts = greatest(p.attempts, %(attempts)s),
    output = coalesce(%(output)s::jsonb, p.output),
    error = coalesce(%(error)s, p.error),
    started_at = CASE WHEN %(status)s = 'running' THEN t.now ELSE p.started_at END,
    finished_at = CASE WHEN %(status)s IN ('done', 'failed', 'cancelled') THEN t.now
                       ELSE p.finished_at END,
    compensated_at = CASE WHEN %(status)s IN ('compensated', 'compensation_failed')
                          THEN t.now ELSE p.compensated_at END
FROM t
WHERE p.saga_id = %(saga_id)s AND p.idx = %(idx)s

-- name: saga_list
-- include: saga_rows
WHERE (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: saga_due
-- Sagas still moving whose deadline passed or whose awaited message was dead-lettered.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT s.id, s.version, s.deadline <= t.now AS expired, d.reason
FROM {schema}sqlbroker_saga s CROSS JOIN t
LEFT JOIN LATERAL (SELECT reason FROM {schema}sqlbroker_dead
                   WHERE message_id = s.message_id LIMIT 1) d ON true
WHERE s.status IN ('running', 'compensating') AND (s.deadline <= t.now OR d.reason IS NOT NULL)
LIMIT %(limit)s

-- name: saga_counts
SELECT status, count(*) FROM {schema}sqlbroker_saga GROUP BY status
