-- SQLite queries of the Spark data source and the archive pipeline. Times are REAL seconds.
-- {..._columns} markers are the column lists of spark/storage/columns.py, and each table_*
-- block is made for every table it serves there (fill_columns).

-- name: stream_column_id
delivery_id

-- name: stream_column_state
'running'

-- name: table_where
-- (A fragment of the per-table blocks below: see fill_columns for the markers.) Positional
-- parameters (SparkStore._filter): ?1 subscription ('' for any), ?2 topic regex ('' for
-- any), ?3/?4 the time window [since, until), ?5/?6 the id range (after, upto].
WHERE (?1 = '' OR subscription = ?1) AND (?2 = '' OR sqlbroker_regex_match(?2, topic))
  AND {time_column} >= ?3 AND {time_column} < ?4 AND id > ?5 AND id <= ?6

-- name: table_range
SELECT min(id), max(id), count(*) FROM {table}
-- include: table_where

-- name: table_read
SELECT {columns} FROM {table}
-- include: table_where
ORDER BY id
LIMIT ?7

-- name: stage_insert
INSERT INTO sqlbroker_spark_stage (
    job_id, partition_id, attempt, seq, topic, payload, content_type, headers, priority,
    ordering_key, idempotency_key, content_hash, max_attempts, dedupe_window, staged_at
) VALUES (
    :job_id, :partition_id, :attempt, :seq, :topic, :payload, :content_type, :headers,
    :priority, :ordering_key, :idempotency_key, :content_hash, :max_attempts, :dedupe_window,
    :now
)

-- name: stage_repeated
-- The contents without a key that the winning attempts staged more than once.
SELECT s.topic, s.content_hash
FROM sqlbroker_spark_stage s
JOIN (SELECT p.value AS partition_id, a.value AS attempt
      FROM json_each(:partitions) p JOIN json_each(:attempts) a ON a.key = p.key) w
  ON w.partition_id = s.partition_id AND w.attempt = s.attempt
WHERE s.job_id = :job_id AND s.idempotency_key IS NULL
GROUP BY s.topic, s.content_hash
HAVING count(*) > 1

-- name: stage_page
-- One page of a task attempt's rows, by the primary key.
SELECT seq, topic, payload, content_type, headers, priority, ordering_key, idempotency_key,
       content_hash, max_attempts, dedupe_window
FROM sqlbroker_spark_stage
WHERE job_id = :job_id AND partition_id = :partition_id AND attempt = :attempt
  AND seq > :after_seq AND seq <= :upto_seq
ORDER BY seq

-- name: stage_delete_page
DELETE FROM sqlbroker_spark_stage
WHERE job_id = :job_id AND partition_id = :partition_id AND attempt = :attempt
  AND seq <= :upto_seq

-- name: stage_delete_job
DELETE FROM sqlbroker_spark_stage WHERE job_id = :job_id

-- name: stage_delete_older
DELETE FROM sqlbroker_spark_stage WHERE staged_at < :older_than

-- name: stream_insert
INSERT INTO sqlbroker_spark_stream (name, subscription, created_at)
VALUES (:stream, :subscription, :now)
ON CONFLICT (name) DO NOTHING

-- name: stream_get
SELECT last_seq, acked_seq FROM sqlbroker_spark_stream WHERE name = :stream

-- name: stream_next_seq
UPDATE sqlbroker_spark_stream SET last_seq = last_seq + 1 WHERE name = :stream
RETURNING last_seq

-- name: stream_claim_snapshot
-- The claimed messages as they are now: a claim is a lease still held, so nothing else
-- changes them before the snapshot commits.
INSERT INTO sqlbroker_spark_claim (
    stream, seq, delivery_id, lease_token, {snapshot_columns}, claimed_at
)
SELECT :stream, :seq, m.id, m.lease_token, {snapshot_values}, :now
FROM sqlbroker_message m
JOIN (SELECT i.value AS id, t.value AS token
      FROM json_each(:ids) i JOIN json_each(:tokens) t ON t.key = i.key) c
  ON c.id = m.id AND c.token = m.lease_token

-- name: stream_read
-- The same columns as a batch read of messages, as they were when claimed.
SELECT {stream_columns}
FROM sqlbroker_spark_claim
WHERE stream = :stream AND seq > :after_seq AND seq <= :upto_seq
  AND delivery_id % :parts = :part
ORDER BY seq, delivery_id

-- name: stream_leases
SELECT delivery_id, lease_token FROM sqlbroker_spark_claim
WHERE stream = :stream AND seq <= :upto_seq
ORDER BY delivery_id

-- name: stream_forget
DELETE FROM sqlbroker_spark_claim WHERE stream = :stream AND seq <= :upto_seq

-- name: stream_acked
UPDATE sqlbroker_spark_stream SET acked_seq = max(acked_seq, :upto_seq) WHERE name = :stream

-- name: table_export_delete
DELETE FROM {table} WHERE {time_column} < :cutoff AND id <= :max_id

-- name: export_record
INSERT INTO sqlbroker_spark_export (
    run_id, cutoff, archive_max_id, dead_max_id, archive_rows, dead_rows, finished_at
) VALUES (:run_id, :cutoff, :archive_max_id, :dead_max_id, :archive_rows, :dead_rows, :now)

-- name: export_get
SELECT count(*) FROM sqlbroker_spark_export WHERE run_id = :run_id

-- name: identity_get
SELECT database_id FROM sqlbroker_identity

-- name: stream_claim_leases
-- The broker's claim (message_claim of storage/sqlite/queries.sql, included as it is:
-- SQLite cannot wrap an UPDATE in a WITH); the stream keeps only its ids and lease tokens.
-- include: message_claim

-- name: stream_promote
-- include: message_promote_scheduled

-- ---------------------------------------------------------------------------------------
-- The export's check against the database (issue 28 item 6): per topic, the rows that
-- <table>_export_delete would remove now, counted here instead of read again through Spark.

-- name: table_export_totals
SELECT topic, count(*), sum(id), min(id), max(id) FROM {table}
WHERE {time_column} < :cutoff AND id <= :max_id
GROUP BY topic
