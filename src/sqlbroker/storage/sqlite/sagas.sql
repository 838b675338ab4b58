-- Sagas (see migrations/0003_sagas.sql). Times are Unix seconds.

-- name: saga_insert
INSERT INTO sqlbroker_saga
    (id, name, status, data, step, version, error, message_id, timeout,
     created_at, updated_at, deadline, finished_at)
VALUES (:id, :name, 'running', :data, 0, 1, NULL, NULL, :timeout,
        :now, :now, :now + :timeout, NULL)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: saga_steps_insert
-- :names and :compensate are JSON arrays of the same length, in step order.
INSERT INTO sqlbroker_saga_step (saga_id, idx, name, compensate, status)
SELECT :saga_id, n.key, n.value, c.value, 'pending'
FROM json_each(:names) n CROSS JOIN (SELECT key, value FROM json_each(:compensate) LIMIT -1) c ON c.key = n.key
ORDER BY n.key

-- name: saga_rows
-- (A fragment, included below.) A saga's columns, read by name (operations/sagas.py).
SELECT id, name, status, data, step, version, error, message_id,
       created_at, updated_at, deadline, finished_at
FROM sqlbroker_saga

-- name: saga_get
-- include: saga_rows
WHERE id = :id

-- name: saga_lock
-- Transitions read the saga inside a write transaction, which holds the whole file: the
-- plain read is the lock.
-- include: saga_get

-- name: saga_steps_get
SELECT idx, name, compensate, status, attempts, output, error,
       started_at, finished_at, compensated_at
FROM sqlbroker_saga_step WHERE saga_id = :id ORDER BY idx

-- name: saga_update
-- A compare-and-set on the version read under the transaction's write lock.
UPDATE sqlbroker_saga
SET status = :status, step = :step, version = version + 1, error = :error,
    message_id = :message_id, updated_at = :now,
    deadline = CASE
        WHEN :status NOT IN ('running', 'compensating') THEN NULL
        WHEN :restart_deadline THEN :now + timeout
        ELSE deadline END,
    finished_at = CASE WHEN :status IN ('running', 'compensating') THEN NULL ELSE :now END
WHERE id = :id AND version = :version

-- name: saga_step_update
UPDATE sqlbroker_saga_step
SET status = :status,
    attempts = max(attempts, :attempts),
    output = coalesce(:output, output),
    error = coalesce(:error, error),
    started_at = CASE WHEN :status = 'running' THEN :now ELSE started_at END,
    finished_at = CASE WHEN :status IN ('done', 'failed', 'cancelled') THEN :now
                       ELSE finished_at END,
    compensated_at = CASE WHEN :status IN ('compensated', 'compensation_failed') THEN :now
                          ELSE compensated_at END
WHERE saga_id = :saga_id AND idx = :idx

-- name: saga_list
-- include: saga_rows
WHERE (:name IS NULL OR name = :name) AND (:status IS NULL OR status = :status)
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: saga_due
-- Sagas still moving whose deadline passed or whose awaited message was dead-lettered.
-- (SQLite lets WHERE name the result columns: the dead letter is looked up once.)
SELECT s.id, s.version, s.deadline <= :now AS expired,
       (SELECT d.reason FROM sqlbroker_dead d WHERE d.message_id = s.message_id LIMIT 1)
           AS dead_reason
FROM sqlbroker_saga s
WHERE s.status IN ('running', 'compensating') AND (expired OR dead_reason IS NOT NULL)
LIMIT :limit

-- name: saga_counts
SELECT status, count(*) FROM sqlbroker_saga GROUP BY status
