-- Listings and the operator's actions (storage/operations/admin.py). Times are Unix
-- seconds; lists arrive as JSON arrays read with json_each.

-- name: message_list
SELECT * FROM (
    SELECT id, message_id, subscription, topic,
           CASE WHEN state = 'scheduled' AND available_at <= :now THEN 'available'
                ELSE state END AS state,
           priority, ordering_key, attempts, max_attempts, enqueued_at, available_at,
           expires_at, lease_expires_at, last_error
    FROM sqlbroker_message
    WHERE (:subscription IS NULL OR subscription = :subscription)
)
WHERE (:state IS NULL OR state = :state)
ORDER BY id
LIMIT :limit

-- name: dead_where
WHERE (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (:subscription IS NULL OR subscription = :subscription)
  AND (:topic IS NULL OR topic = :topic)
  AND (:error_type IS NULL OR error_type IN (SELECT value FROM json_each(:error_types))
       OR substr(error_type, -length(:error_suffix)) = :error_suffix)
  AND (:reason_contains IS NULL OR instr(reason, :reason_contains) > 0)
  AND (:dead_before IS NULL OR dead_at < :dead_before)
  AND (:dead_after IS NULL OR dead_at >= :dead_after)

-- name: dead_select
SELECT id, message_id, subscription, topic, payload, content_type, headers, priority,
       ordering_key, idempotency_key, attempts, max_attempts, replay_count, reason,
       error_type, error_message, traceback, enqueued_at, first_started_at, first_failed_at,
       last_failed_at, dead_at
FROM sqlbroker_dead
-- include: dead_where
  AND (:after_id IS NULL OR id > :after_id)
ORDER BY id
LIMIT :limit

-- name: dead_lock
-- The write transaction (BEGIN IMMEDIATE) already keeps every other writer out.
SELECT id FROM sqlbroker_dead
-- include: dead_where
ORDER BY id

-- name: dead_keys
SELECT DISTINCT ordering_key FROM sqlbroker_dead
WHERE ordering_key IS NOT NULL AND id IN (SELECT value FROM json_each(:ids))

-- name: dead_subscriptions_ensure
INSERT INTO sqlbroker_subscription (name, created_at)
SELECT DISTINCT subscription, :now FROM sqlbroker_dead
WHERE id IN (SELECT value FROM json_each(:ids))
ON CONFLICT (name) DO NOTHING

-- name: dead_replay_insert
-- A copy with an ordering key waits (blocked) behind any copy of its key still queued, and
-- behind the earlier of its own replayed siblings.
INSERT INTO sqlbroker_message (
    message_id, subscription, topic, state, priority, ordering_key, idempotency_key,
    payload, content_type, headers, attempts, max_attempts, replay_count, enqueued_at,
    available_at, expires_at
)
SELECT d.message_id, d.subscription, d.topic,
       CASE WHEN d.ordering_key IS NOT NULL AND (
                EXISTS (SELECT 1 FROM sqlbroker_message o
                        WHERE o.subscription = d.subscription AND o.ordering_key = d.ordering_key)
                OR row_number() OVER (PARTITION BY d.subscription, d.ordering_key ORDER BY d.id) > 1
            ) THEN 'blocked' ELSE 'available' END,
       d.priority, d.ordering_key,
       d.idempotency_key, d.payload, d.content_type, d.headers, 0, d.max_attempts,
       d.replay_count + 1, d.enqueued_at, :now, NULL
FROM sqlbroker_dead d
WHERE d.id IN (SELECT value FROM json_each(:ids))
ORDER BY d.id
RETURNING id, subscription

-- name: dead_delete_ids
DELETE FROM sqlbroker_dead WHERE id IN (SELECT value FROM json_each(:ids))

-- name: audit_insert
INSERT INTO sqlbroker_audit (at, actor, action, detail) VALUES (:now, :actor, :action, :detail)

-- name: archive_list
SELECT id, message_id, subscription, topic, payload, content_type, headers, priority,
       ordering_key, outcome, attempts, replay_count, enqueued_at, first_started_at, finished_at
FROM sqlbroker_archive
WHERE (:subscription IS NULL OR subscription = :subscription)
  AND (:outcome IS NULL OR outcome = :outcome)
  AND (:message_id IS NULL OR message_id = :message_id)
ORDER BY id DESC
LIMIT :limit

-- name: stats
-- A scheduled copy whose time has come is ready: the next claim promotes it. A time that is
-- not a number (raw SQL; docs/security.md, "Damaged rows") has no age.
WITH m AS (
    SELECT subscription, available_at,
           CASE WHEN state = 'scheduled' AND available_at <= :now THEN 'available'
                ELSE state END AS state
    FROM sqlbroker_message
),
hot AS (
    SELECT subscription,
           sum(state = 'available') AS ready,
           sum(state = 'scheduled') AS scheduled,
           sum(state = 'running') AS running,
           sum(state = 'blocked') AS blocked,
           min(CASE WHEN state = 'available' AND typeof(available_at) IN ('integer', 'real')
                    THEN available_at END) AS oldest
    FROM m GROUP BY subscription
),
dead AS (SELECT subscription, count(*) AS dead FROM sqlbroker_dead GROUP BY subscription),
names AS (
    SELECT name FROM sqlbroker_subscription
    UNION SELECT subscription FROM hot
    UNION SELECT subscription FROM dead
)
SELECT n.name, coalesce(h.ready, 0), coalesce(h.scheduled, 0), coalesce(h.running, 0),
       coalesce(h.blocked, 0), coalesce(d.dead, 0),
       CASE WHEN h.oldest IS NOT NULL THEN max(0.0, :now - h.oldest) END,
       coalesce((SELECT s.paused FROM sqlbroker_subscription s WHERE s.name = n.name), 0)
FROM names n
LEFT JOIN hot h ON h.subscription = n.name
LEFT JOIN dead d ON d.subscription = n.name
ORDER BY n.name
