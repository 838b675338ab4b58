-- SQLite queries of sqlbroker. Named parameters (:name); times are REAL Unix seconds.
-- Batches arrive as one JSON array parameter (:batch) read with json_each.

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS sqlbroker_schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)

-- name: schema_version
SELECT coalesce(max(version), 0) FROM sqlbroker_schema_version

-- name: schema_version_exists
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sqlbroker_schema_version'

-- name: schema_version_insert
INSERT INTO sqlbroker_schema_version (version, name, applied_at) VALUES (:version, :name, :now)

-- name: schema_version_printed
-- The version row of one migration in the printed schema (``sqlbroker schema --print``),
-- which runs with no parameters: {version} and {name} come from the migration's file name.
INSERT INTO sqlbroker_schema_version (version, name, applied_at)
VALUES ({version}, '{name}', (julianday('now') - 2440587.5) * 86400.0)

-- name: subscription_insert
INSERT INTO sqlbroker_subscription (name, created_at) VALUES (:name, :now)
ON CONFLICT (name) DO NOTHING

-- name: subscription_patterns_clear
DELETE FROM sqlbroker_subscription_pattern WHERE subscription = :name

-- name: subscription_pattern_insert
INSERT INTO sqlbroker_subscription_pattern (subscription, pattern, regex)
VALUES (:name, :pattern, :regex)
ON CONFLICT (subscription, pattern) DO NOTHING

-- name: subscription_get
SELECT s.name, s.created_at, p.pattern
FROM sqlbroker_subscription s
LEFT JOIN sqlbroker_subscription_pattern p ON p.subscription = s.name
WHERE s.name = :name
ORDER BY p.pattern

-- name: subscription_list
SELECT s.name, s.created_at, p.pattern
FROM sqlbroker_subscription s
LEFT JOIN sqlbroker_subscription_pattern p ON p.subscription = s.name
ORDER BY s.name, p.pattern

-- name: subscription_delete
DELETE FROM sqlbroker_subscription WHERE name = :name

-- name: subscription_delete_messages
DELETE FROM sqlbroker_message WHERE subscription = :name

-- name: subscription_exists
SELECT count(*) FROM sqlbroker_subscription WHERE name = :name

-- name: dedupe_reserve
INSERT INTO sqlbroker_dedupe (topic, idempotency_key, message_id, payload_hash, created_at, expires_at)
VALUES (:topic, :idempotency_key, :message_id, :payload_hash, :now, :now + :window)
ON CONFLICT (topic, idempotency_key) DO UPDATE
    SET message_id = excluded.message_id,
        payload_hash = excluded.payload_hash,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE sqlbroker_dedupe.expires_at <= :now

-- name: dedupe_get
SELECT message_id, payload_hash FROM sqlbroker_dedupe
WHERE topic = :topic AND idempotency_key = :idempotency_key

-- name: dedupe_trim
DELETE FROM sqlbroker_dedupe
WHERE (topic, idempotency_key) IN (
    SELECT topic, idempotency_key FROM sqlbroker_dedupe WHERE expires_at <= :now LIMIT :limit
)

-- name: subscription_room
-- What the limits are checked against (core/limits.py): the patterns of one subscription
-- and the totals of the database, inside the transaction that just wrote them.
SELECT (SELECT count(*) FROM sqlbroker_subscription_pattern WHERE subscription = :name),
       (SELECT count(*) FROM sqlbroker_subscription),
       (SELECT count(*) FROM sqlbroker_subscription_pattern)

-- name: message_routes
-- Routing matches the stored pattern (validated again in Python: a damaged row matches
-- nothing), never the stored regex. Cheap tests first, so that most patterns never reach
-- the full match: a matching pattern's first segment is '*', '#' or the topic's first
-- word (:head is that word and a dot), and its last segment '*', '#' or the topic's last
-- word (:tail is a dot and that word).
SELECT DISTINCT subscription FROM sqlbroker_subscription_pattern
WHERE CASE
    WHEN pattern = :topic OR pattern = '#' THEN 1
    WHEN pattern = '*' THEN sqlbroker_pattern_match(pattern, :topic)
    WHEN NOT (substr(pattern, 1, length(:head)) = :head OR substr(pattern, 1, 2) IN ('*.', '#.'))
        THEN 0
    WHEN NOT (substr(pattern, -length(:tail)) = :tail OR substr(pattern, -2) IN ('.*', '.#'))
        THEN 0
    ELSE sqlbroker_pattern_match(pattern, :topic)
END
ORDER BY subscription

-- name: message_insert
-- A copy whose ordering key already has a copy in its subscription waits, blocked, behind
-- it (rows are inserted one by one, so this sees earlier rows of the same batch).
INSERT INTO sqlbroker_message (
    message_id, subscription, topic, state, priority, ordering_key, idempotency_key,
    payload, content_type, headers, max_attempts, enqueued_at, available_at, expires_at
)
SELECT :message_id, :subscription, :topic,
       CASE WHEN :ordering_key IS NOT NULL AND EXISTS (
                SELECT 1 FROM sqlbroker_message
                WHERE subscription = :subscription AND ordering_key = :ordering_key
            ) THEN 'blocked' ELSE :state END,
       :priority, :ordering_key, :idempotency_key, :payload, :content_type, :headers,
       :max_attempts, :now, :available_at, :expires_at

-- name: archive_insert_unrouted
INSERT INTO sqlbroker_archive (
    delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
    idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
    enqueued_at, first_started_at, finished_at
) VALUES (
    NULL, :message_id, NULL, :topic, 'unrouted', :priority, :ordering_key,
    :idempotency_key, :payload, :content_type, :headers, 0, :max_attempts, 0,
    :now, NULL, :now
)

-- name: message_promote_scheduled
UPDATE sqlbroker_message SET state = 'available'
WHERE id IN (
    SELECT id FROM sqlbroker_message
    WHERE state = 'scheduled' AND subscription = :subscription AND available_at <= :now
    ORDER BY available_at
    LIMIT :limit
)

-- name: message_claim
UPDATE sqlbroker_message
SET state = 'running',
    attempts = attempts + 1,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = :now + :lease,
    first_started_at = coalesce(first_started_at, :now),
    worker = :worker,
    max_attempts = coalesce(:max_attempts, max_attempts)
WHERE id IN (
    SELECT id FROM sqlbroker_message
    WHERE subscription = :subscription
      AND state = 'available'
      AND available_at <= :now
      AND (expires_at IS NULL OR expires_at > :now)
    ORDER BY priority, available_at, id
    LIMIT :limit
)
RETURNING id, message_id, subscription, topic, payload, content_type, headers, priority,
          ordering_key, idempotency_key, attempts, max_attempts, replay_count, enqueued_at,
          available_at, expires_at, lease_token, lease_expires_at

-- name: lease_valid_ids
SELECT m.id FROM sqlbroker_message m
JOIN (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token
      FROM json_each(:batch)) b ON b.id = m.id AND b.token = m.lease_token
WHERE m.state = 'running'
ORDER BY m.id

-- name: archive_insert_ids
INSERT INTO sqlbroker_archive (
    delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
    idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
    enqueued_at, first_started_at, finished_at
)
SELECT id, message_id, subscription, topic, :outcome, priority, ordering_key,
       idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
       enqueued_at, first_started_at, :now
FROM sqlbroker_message
WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: message_delete_ids
DELETE FROM sqlbroker_message WHERE id IN (SELECT value FROM json_each(:ids))

-- name: key_heads_of_ids
-- The keys whose head (their one copy that is not blocked) is among these ids.
SELECT DISTINCT subscription, ordering_key FROM sqlbroker_message
WHERE id IN (SELECT value FROM json_each(:ids))
  AND ordering_key IS NOT NULL AND state <> 'blocked'

-- name: key_promote
-- After a key's head left, the oldest blocked copy of the key becomes its head (unless a
-- head exists). The head is looked for once per key: tested for every blocked copy, as it
-- was, a promotion cost the square of the key's backlog (644 msg/s draining 12,000 keyed
-- messages against 3,930 for 3,000).
UPDATE sqlbroker_message
SET state = CASE WHEN available_at > :now THEN 'scheduled' ELSE 'available' END
WHERE id IN (
    SELECT (SELECT b.id FROM sqlbroker_message b
            WHERE b.subscription = k.subscription AND b.ordering_key = k.ordering_key
              AND b.state = 'blocked'
            ORDER BY b.id
            LIMIT 1)
    FROM (SELECT DISTINCT json_extract(value, '$[0]') AS subscription,
                          json_extract(value, '$[1]') AS ordering_key
          FROM json_each(:keys)) k
    WHERE NOT EXISTS (
        SELECT 1 FROM sqlbroker_message o
        WHERE o.subscription = k.subscription AND o.ordering_key = k.ordering_key
          AND o.ordering_key IS NOT NULL AND o.state <> 'blocked'
    )
)

-- name: key_repair
-- Keys left with blocked copies and no head (only possible after an interrupted
-- promotion) get their oldest blocked copy promoted.
UPDATE sqlbroker_message
SET state = CASE WHEN available_at > :now THEN 'scheduled' ELSE 'available' END
WHERE id IN (
    SELECT min(b.id) FROM sqlbroker_message b
    WHERE b.state = 'blocked'
    GROUP BY b.subscription, b.ordering_key
    -- Once per key, as in key_promote.
    HAVING NOT EXISTS (
        SELECT 1 FROM sqlbroker_message o
        WHERE o.subscription = b.subscription AND o.ordering_key = b.ordering_key
          AND o.ordering_key IS NOT NULL AND o.state <> 'blocked'
    )
    LIMIT :limit
)

-- name: message_retry
UPDATE sqlbroker_message
SET state = CASE WHEN b.after > 0 THEN 'scheduled' ELSE 'available' END,
    available_at = :now + b.after,
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL,
    attempts = sqlbroker_message.attempts - b.snooze,
    last_error = coalesce(b.last_error, sqlbroker_message.last_error),
    first_failed_at = CASE WHEN b.snooze THEN sqlbroker_message.first_failed_at
                           ELSE coalesce(sqlbroker_message.first_failed_at, :now) END,
    last_failed_at = CASE WHEN b.snooze THEN sqlbroker_message.last_failed_at ELSE :now END
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
             json_extract(value, '$[2]') AS after, json_extract(value, '$[3]') AS last_error,
             json_extract(value, '$[4]') AS snooze
      FROM json_each(:batch)) b
WHERE b.id = sqlbroker_message.id AND b.token = sqlbroker_message.lease_token
  AND sqlbroker_message.state = 'running'
RETURNING sqlbroker_message.id

-- name: dead_insert_leased
INSERT INTO sqlbroker_dead (
    delivery_id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
    payload, content_type, headers, attempts, max_attempts, replay_count, reason, error_type,
    error_message, traceback, enqueued_at, first_started_at, first_failed_at, last_failed_at,
    dead_at
)
SELECT m.id, m.message_id, m.subscription, m.topic, m.priority, m.ordering_key,
       m.idempotency_key, m.payload, m.content_type, m.headers, m.attempts, m.max_attempts,
       m.replay_count, b.reason, b.error_type, b.error_message, b.traceback, m.enqueued_at,
       m.first_started_at, coalesce(m.first_failed_at, :now), :now, :now
FROM sqlbroker_message m
JOIN (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
             json_extract(value, '$[2]') AS reason, json_extract(value, '$[3]') AS error_type,
             json_extract(value, '$[4]') AS error_message, json_extract(value, '$[5]') AS traceback
      FROM json_each(:batch)) b ON b.id = m.id AND b.token = m.lease_token
WHERE m.state = 'running'
ORDER BY m.id

-- name: dead_insert_ids
INSERT INTO sqlbroker_dead (
    delivery_id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
    payload, content_type, headers, attempts, max_attempts, replay_count, reason, error_type,
    error_message, traceback, enqueued_at, first_started_at, first_failed_at, last_failed_at,
    dead_at
)
SELECT id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
       payload, content_type, headers, attempts, max_attempts, replay_count, :reason,
       :error_type, :error_message, NULL, enqueued_at, first_started_at,
       coalesce(first_failed_at, :now), :now, :now
FROM sqlbroker_message
WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: message_extend
UPDATE sqlbroker_message
SET lease_expires_at = :now + :lease
WHERE state = 'running' AND id IN (SELECT value FROM json_each(:ids))
RETURNING id, lease_expires_at

-- name: message_release
UPDATE sqlbroker_message
SET state = 'available',
    attempts = max(attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL
WHERE state = 'running' AND id IN (SELECT value FROM json_each(:ids))
RETURNING id

-- name: lease_expired_spent_ids
SELECT id FROM sqlbroker_message
WHERE state = 'running' AND lease_expires_at <= :now AND attempts >= max_attempts
ORDER BY lease_expires_at
LIMIT :limit

-- name: lease_expired_release
UPDATE sqlbroker_message
SET state = 'available',
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL,
    last_error = :last_error,
    first_failed_at = coalesce(first_failed_at, :now),
    last_failed_at = :now
WHERE id IN (
    SELECT id FROM sqlbroker_message
    WHERE state = 'running' AND lease_expires_at <= :now
    ORDER BY lease_expires_at
    LIMIT :limit
)

-- name: message_expired_ids
SELECT id FROM sqlbroker_message
WHERE expires_at <= :now AND state <> 'running'
ORDER BY expires_at
LIMIT :limit

-- name: message_cancel_ids
SELECT id FROM sqlbroker_message
WHERE message_id IN (SELECT value FROM json_each(:message_ids)) AND state <> 'running'

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

-- name: dead_select
SELECT id, message_id, subscription, topic, payload, content_type, headers, priority,
       ordering_key, idempotency_key, attempts, max_attempts, replay_count, reason,
       error_type, error_message, traceback, enqueued_at, first_started_at, first_failed_at,
       last_failed_at, dead_at
FROM sqlbroker_dead
WHERE (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (:subscription IS NULL OR subscription = :subscription)
  AND (:topic IS NULL OR topic = :topic)
  AND (:error_type IS NULL OR error_type IN (SELECT value FROM json_each(:error_types))
       OR substr(error_type, -length(:error_suffix)) = :error_suffix)
  AND (:reason_contains IS NULL OR instr(reason, :reason_contains) > 0)
  AND (:dead_before IS NULL OR dead_at < :dead_before)
  AND (:dead_after IS NULL OR dead_at >= :dead_after)
  AND (:after_id IS NULL OR id > :after_id)
ORDER BY id
LIMIT :limit

-- name: dead_replay_insert
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
RETURNING id

-- name: subscription_ensure_many
INSERT INTO sqlbroker_subscription (name, created_at)
SELECT DISTINCT value, :now FROM json_each(:names)
WHERE true
ON CONFLICT (name) DO NOTHING

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

-- name: stats_hot
-- A scheduled copy whose time has come is ready: it is promoted by the next claim. A time
-- that is not a number (raw SQL; docs/security.md, "Damaged rows") has no age.
SELECT subscription, effective_state, count(*),
       min(CASE WHEN effective_state = 'available' AND typeof(available_at) IN ('integer', 'real')
                THEN available_at END)
FROM (
    SELECT subscription, available_at,
           CASE WHEN state = 'scheduled' AND available_at <= :now THEN 'available'
                ELSE state END AS effective_state
    FROM sqlbroker_message
)
GROUP BY subscription, effective_state

-- name: stats_dead
SELECT subscription, count(*) FROM sqlbroker_dead GROUP BY subscription

-- name: stats_subscriptions
SELECT name FROM sqlbroker_subscription

-- name: dead_subscriptions
SELECT DISTINCT subscription FROM sqlbroker_dead WHERE id IN (SELECT value FROM json_each(:ids))

-- name: table_counts
SELECT 'sqlbroker_subscription', count(*) FROM sqlbroker_subscription
UNION ALL SELECT 'sqlbroker_subscription_pattern', count(*) FROM sqlbroker_subscription_pattern
UNION ALL SELECT 'sqlbroker_message', count(*) FROM sqlbroker_message
UNION ALL SELECT 'sqlbroker_archive', count(*) FROM sqlbroker_archive
UNION ALL SELECT 'sqlbroker_dead', count(*) FROM sqlbroker_dead
UNION ALL SELECT 'sqlbroker_dedupe', count(*) FROM sqlbroker_dedupe
UNION ALL SELECT 'sqlbroker_audit', count(*) FROM sqlbroker_audit
UNION ALL SELECT 'sqlbroker_processed', count(*) FROM sqlbroker_processed
UNION ALL SELECT 'sqlbroker_worker', count(*) FROM sqlbroker_worker
UNION ALL SELECT 'sqlbroker_metric_minute', count(*) FROM sqlbroker_metric_minute
UNION ALL SELECT 'sqlbroker_metric_total', count(*) FROM sqlbroker_metric_total
UNION ALL SELECT 'sqlbroker_schedule', count(*) FROM sqlbroker_schedule
UNION ALL SELECT 'sqlbroker_saga', count(*) FROM sqlbroker_saga
UNION ALL SELECT 'sqlbroker_saga_step', count(*) FROM sqlbroker_saga_step
UNION ALL SELECT 'sqlbroker_spark_stage', count(*) FROM sqlbroker_spark_stage
UNION ALL SELECT 'sqlbroker_spark_stream', count(*) FROM sqlbroker_spark_stream
UNION ALL SELECT 'sqlbroker_spark_claim', count(*) FROM sqlbroker_spark_claim
UNION ALL SELECT 'sqlbroker_spark_export', count(*) FROM sqlbroker_spark_export
UNION ALL SELECT 'sqlbroker_identity', count(*) FROM sqlbroker_identity
