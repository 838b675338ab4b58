-- PostgreSQL queries of the Spark data source and the archive pipeline.
-- {..._columns} markers are the column lists of spark/storage/columns.py (fill_columns).
-- Batch reads go through ADBC (Arrow all the way) with positional parameters:
-- $1 subscription ('' for any), $2 topic regex ('' for any), $3/$4 the time window
-- [since, until), $5/$6 the id range (after, upto]. The regex is matched against
-- '.' || topic, like every pattern (see core.topics.pattern_regex).

-- name: column_message_id
message_id::text AS message_id

-- name: column_priority
priority::int AS priority

-- name: stream_column_id
delivery_id AS id

-- name: stream_column_state
'running' AS state

-- name: messages_where
WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR ('.' || topic) ~ $2)
  AND enqueued_at >= $3 AND enqueued_at < $4 AND id > $5 AND id <= $6

-- name: archive_where
WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR ('.' || topic) ~ $2)
  AND finished_at >= $3 AND finished_at < $4 AND id > $5 AND id <= $6

-- name: dead_where
WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR ('.' || topic) ~ $2)
  AND dead_at >= $3 AND dead_at < $4 AND id > $5 AND id <= $6

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
SELECT {messages_columns} FROM {schema}sqlbroker_message
-- include: messages_where
ORDER BY id

-- name: archive_read
SELECT {archive_columns} FROM {schema}sqlbroker_archive
-- include: archive_where
ORDER BY id

-- name: dead_read
SELECT {dead_columns} FROM {schema}sqlbroker_dead
-- include: dead_where
ORDER BY id

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

-- name: stage_repeated
-- The contents without a key that the winning attempts staged more than once.
SELECT s.topic, s.content_hash
FROM {schema}sqlbroker_spark_stage s
JOIN unnest(%(partitions)s::integer[], %(attempts)s::bigint[]) AS w(partition_id, attempt)
  ON w.partition_id = s.partition_id AND w.attempt = s.attempt
WHERE s.job_id = %(job_id)s AND s.idempotency_key IS NULL
GROUP BY s.topic, s.content_hash
HAVING count(*) > 1

-- name: stage_page
-- One page of a task attempt's rows, by the primary key.
SELECT seq, topic, payload, content_type, headers, priority, ordering_key, idempotency_key,
       content_hash, max_attempts, dedupe_window
FROM {schema}sqlbroker_spark_stage
WHERE job_id = %(job_id)s AND partition_id = %(partition_id)s AND attempt = %(attempt)s
  AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: stage_delete_page
DELETE FROM {schema}sqlbroker_spark_stage
WHERE job_id = %(job_id)s AND partition_id = %(partition_id)s AND attempt = %(attempt)s
  AND seq <= %(upto_seq)s

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

-- name: stream_next_seq
-- The row lock taken here orders the claimers of one stream: a sequence number is
-- visible only once every smaller one has committed.
UPDATE {schema}sqlbroker_spark_stream SET last_seq = last_seq + 1 WHERE name = %(stream)s
RETURNING last_seq

-- name: stream_claim_snapshot
-- The claimed messages as they are now: a claim is a lease still held, so nothing else
-- changes them before the snapshot commits.
INSERT INTO {schema}sqlbroker_spark_claim (
    stream, seq, delivery_id, lease_token, {snapshot_columns}, claimed_at
)
SELECT %(stream)s, %(seq)s, m.id, m.lease_token, {snapshot_values},
       coalesce(%(now)s::timestamptz, statement_timestamp())
FROM {schema}sqlbroker_message m
JOIN unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS c(id, token)
  ON c.id = m.id AND c.token = m.lease_token::text

-- name: stream_read
-- The same columns as a batch read of messages, as they were when claimed.
SELECT {stream_columns}
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
