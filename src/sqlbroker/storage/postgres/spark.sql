-- PostgreSQL queries of the Spark data source and the archive pipeline. Times leave as
-- float seconds since the Unix epoch, the form both backends hand to Spark.

-- name: messages_where
WHERE (%(subscription)s::text IS NULL OR subscription = %(subscription)s)
  AND (%(topic_regex)s::text IS NULL OR ('.' || topic) ~ %(topic_regex)s)
  AND (%(since)s::timestamptz IS NULL OR enqueued_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR enqueued_at < %(until)s)
  AND (%(min_id)s::bigint IS NULL OR id >= %(min_id)s)
  AND (%(max_id)s::bigint IS NULL OR id <= %(max_id)s)

-- name: archive_where
WHERE (%(subscription)s::text IS NULL OR subscription = %(subscription)s)
  AND (%(topic_regex)s::text IS NULL OR ('.' || topic) ~ %(topic_regex)s)
  AND (%(since)s::timestamptz IS NULL OR finished_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR finished_at < %(until)s)
  AND (%(min_id)s::bigint IS NULL OR id >= %(min_id)s)
  AND (%(max_id)s::bigint IS NULL OR id <= %(max_id)s)

-- name: dead_where
WHERE (%(subscription)s::text IS NULL OR subscription = %(subscription)s)
  AND (%(topic_regex)s::text IS NULL OR ('.' || topic) ~ %(topic_regex)s)
  AND (%(since)s::timestamptz IS NULL OR dead_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR dead_at < %(until)s)
  AND (%(min_id)s::bigint IS NULL OR id >= %(min_id)s)
  AND (%(max_id)s::bigint IS NULL OR id <= %(max_id)s)

-- name: messages_range
SELECT min(id), max(id), count(*) FROM {schema}sqlbroker_message
-- include: messages_where

-- name: archive_range
SELECT min(id), max(id), count(*) FROM {schema}sqlbroker_archive
-- include: archive_where

-- name: dead_range
SELECT min(id), max(id), count(*) FROM {schema}sqlbroker_dead
-- include: dead_where

-- name: messages_read
SELECT id, message_id::text, subscription, topic, state, priority::int, ordering_key,
       idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
       extract(epoch FROM enqueued_at)::float8, extract(epoch FROM available_at)::float8,
       extract(epoch FROM expires_at)::float8, extract(epoch FROM first_started_at)::float8,
       extract(epoch FROM lease_expires_at)::float8, last_error
FROM {schema}sqlbroker_message
-- include: messages_where
  AND id > %(after_id)s AND id <= %(upto_id)s
ORDER BY id
LIMIT %(limit)s

-- name: archive_read
SELECT id, delivery_id, message_id::text, subscription, topic, outcome, priority::int,
       ordering_key, idempotency_key, payload, content_type, headers, attempts, max_attempts,
       replay_count, extract(epoch FROM enqueued_at)::float8,
       extract(epoch FROM first_started_at)::float8, extract(epoch FROM finished_at)::float8
FROM {schema}sqlbroker_archive
-- include: archive_where
  AND id > %(after_id)s AND id <= %(upto_id)s
ORDER BY id
LIMIT %(limit)s

-- name: dead_read
SELECT id, delivery_id, message_id::text, subscription, topic, priority::int, ordering_key,
       idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
       reason, error_type, error_message, traceback, extract(epoch FROM enqueued_at)::float8,
       extract(epoch FROM first_started_at)::float8, extract(epoch FROM first_failed_at)::float8,
       extract(epoch FROM last_failed_at)::float8, extract(epoch FROM dead_at)::float8
FROM {schema}sqlbroker_dead
-- include: dead_where
  AND id > %(after_id)s AND id <= %(upto_id)s
ORDER BY id
LIMIT %(limit)s

-- name: stage_insert
INSERT INTO {schema}sqlbroker_spark_stage (
    job_id, partition_id, attempt, seq, topic, payload, content_type, headers, priority,
    ordering_key, idempotency_key, content_hash, max_attempts, dedupe_window, staged_at
) VALUES (
    %(job_id)s, %(partition_id)s, %(attempt)s, %(seq)s, %(topic)s, %(payload)s,
    %(content_type)s, %(headers)s, %(priority)s, %(ordering_key)s, %(idempotency_key)s,
    %(content_hash)s, %(max_attempts)s, %(dedupe_window)s,
    coalesce(%(now)s::timestamptz, statement_timestamp())
)

-- name: stage_select
-- The winning attempt's rows of each partition, in a stable order.
SELECT s.topic, s.payload, s.content_type, s.headers, s.priority, s.ordering_key,
       s.idempotency_key, s.content_hash, s.max_attempts, s.dedupe_window
FROM {schema}sqlbroker_spark_stage s
JOIN unnest(%(partitions)s::integer[], %(attempts)s::bigint[]) AS w(partition_id, attempt)
  ON w.partition_id = s.partition_id AND w.attempt = s.attempt
WHERE s.job_id = %(job_id)s
ORDER BY s.partition_id, s.seq

-- name: stage_delete_job
DELETE FROM {schema}sqlbroker_spark_stage WHERE job_id = %(job_id)s

-- name: stage_delete_older
DELETE FROM {schema}sqlbroker_spark_stage WHERE staged_at < %(older_than)s

-- name: stream_insert
INSERT INTO {schema}sqlbroker_spark_stream (name, subscription, created_at)
VALUES (%(stream)s, %(subscription)s, coalesce(%(now)s::timestamptz, statement_timestamp()))
ON CONFLICT (name) DO NOTHING

-- name: stream_get
SELECT last_seq, acked_seq FROM {schema}sqlbroker_spark_stream WHERE name = %(stream)s

-- name: stream_lock
SELECT last_seq FROM {schema}sqlbroker_spark_stream WHERE name = %(stream)s FOR UPDATE

-- name: stream_next_seq
UPDATE {schema}sqlbroker_spark_stream SET last_seq = last_seq + 1 WHERE name = %(stream)s
RETURNING last_seq

-- name: stream_claim_snapshot
INSERT INTO {schema}sqlbroker_spark_claim (
    stream, seq, delivery_id, lease_token, message_id, subscription, topic, priority,
    ordering_key, idempotency_key, payload, content_type, headers, attempts, max_attempts,
    replay_count, enqueued_at, available_at, expires_at, first_started_at, lease_expires_at,
    last_error, claimed_at
)
SELECT %(stream)s, %(seq)s, m.id, m.lease_token, m.message_id, m.subscription, m.topic,
       m.priority, m.ordering_key, m.idempotency_key, m.payload, m.content_type, m.headers,
       m.attempts, m.max_attempts, m.replay_count, m.enqueued_at, m.available_at, m.expires_at,
       m.first_started_at, m.lease_expires_at, m.last_error,
       coalesce(%(now)s::timestamptz, statement_timestamp())
FROM {schema}sqlbroker_message m
JOIN unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS c(id, token)
  ON c.id = m.id AND c.token = m.lease_token::text

-- name: stream_read
-- The same columns as a batch read of messages, as they were when claimed.
SELECT delivery_id, message_id::text, subscription, topic, 'running', priority::int,
       ordering_key, idempotency_key, payload, content_type, headers, attempts, max_attempts,
       replay_count, extract(epoch FROM enqueued_at)::float8,
       extract(epoch FROM available_at)::float8, extract(epoch FROM expires_at)::float8,
       extract(epoch FROM first_started_at)::float8,
       extract(epoch FROM lease_expires_at)::float8, last_error
FROM {schema}sqlbroker_spark_claim
WHERE stream = %(stream)s AND seq > %(after_seq)s AND seq <= %(upto_seq)s
  AND delivery_id %% %(parts)s = %(part)s
ORDER BY seq, delivery_id

-- name: stream_leases
SELECT delivery_id, lease_token::text FROM {schema}sqlbroker_spark_claim
WHERE stream = %(stream)s AND seq <= %(upto_seq)s
ORDER BY delivery_id

-- name: stream_forget
DELETE FROM {schema}sqlbroker_spark_claim WHERE stream = %(stream)s AND seq <= %(upto_seq)s

-- name: stream_acked
UPDATE {schema}sqlbroker_spark_stream SET acked_seq = greatest(acked_seq, %(upto_seq)s)
WHERE name = %(stream)s

-- name: export_delete_archive
DELETE FROM {schema}sqlbroker_archive WHERE finished_at < %(cutoff)s AND id <= %(max_id)s

-- name: export_delete_dead
DELETE FROM {schema}sqlbroker_dead WHERE dead_at < %(cutoff)s AND id <= %(max_id)s

-- name: export_record
INSERT INTO {schema}sqlbroker_spark_export (
    run_id, cutoff, archive_max_id, dead_max_id, archive_rows, dead_rows, finished_at
) VALUES (
    %(run_id)s, %(cutoff)s, %(archive_max_id)s, %(dead_max_id)s, %(archive_rows)s,
    %(dead_rows)s, coalesce(%(now)s::timestamptz, statement_timestamp())
)

-- name: export_get
SELECT count(*) FROM {schema}sqlbroker_spark_export WHERE run_id = %(run_id)s

-- name: identity_get
-- The stored id, the cluster's system identifier and the database's oid: a database cloned
-- from a template or restored from a dump copies the row, not the other two.
SELECT i.database_id || ':' || c.system_identifier::text || ':' || d.oid::text
FROM {schema}sqlbroker_identity i
CROSS JOIN pg_control_system() c
JOIN pg_database d ON d.datname = current_database()
