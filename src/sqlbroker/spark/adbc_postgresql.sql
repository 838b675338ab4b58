-- Batch reads of PostgreSQL through ADBC (Arrow all the way). Positional parameters:
-- $1 subscription ('' for any), $2 topic regex ('' for any), $3/$4 the time window
-- [since, until), $5/$6 the id range (after, upto]. The regex is matched against
-- '.' || topic, like every pattern (see core.topics.pattern_regex).

-- name: messages_read
SELECT id, message_id::text AS message_id, subscription, topic, state,
       priority::int AS priority, ordering_key, idempotency_key, payload, content_type,
       headers, attempts, max_attempts, replay_count, enqueued_at, available_at, expires_at,
       first_started_at, lease_expires_at, last_error
FROM {schema}sqlbroker_message
WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR ('.' || topic) ~ $2)
  AND enqueued_at >= $3 AND enqueued_at < $4 AND id > $5 AND id <= $6
ORDER BY id

-- name: archive_read
SELECT id, delivery_id, message_id::text AS message_id, subscription, topic, outcome,
       priority::int AS priority, ordering_key, idempotency_key, payload, content_type,
       headers, attempts, max_attempts, replay_count, enqueued_at, first_started_at,
       finished_at
FROM {schema}sqlbroker_archive
WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR ('.' || topic) ~ $2)
  AND finished_at >= $3 AND finished_at < $4 AND id > $5 AND id <= $6
ORDER BY id

-- name: dead_read
SELECT id, delivery_id, message_id::text AS message_id, subscription, topic,
       priority::int AS priority, ordering_key, idempotency_key, payload, content_type,
       headers, attempts, max_attempts, replay_count, reason, error_type, error_message,
       traceback, enqueued_at, first_started_at, first_failed_at, last_failed_at, dead_at
FROM {schema}sqlbroker_dead
WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR ('.' || topic) ~ $2)
  AND dead_at >= $3 AND dead_at < $4 AND id > $5 AND id <= $6
ORDER BY id
