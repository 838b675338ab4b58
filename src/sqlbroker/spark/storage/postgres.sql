-- PostgreSQL queries of the Spark data source and the archive pipeline.
-- {..._columns} markers are the column lists of spark/storage/columns.py, and each table_*
-- block is made for every table it serves there (fill_columns).
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

-- name: table_where
-- (A fragment of the per-table blocks below: see fill_columns for the markers.)
WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR ('.' || topic) ~ $2)
  AND {time_column} >= $3 AND {time_column} < $4 AND id > $5 AND id <= $6

-- name: table_range
SELECT min(id), max(id), count(*) FROM {schema}{table}
-- include: table_where

-- name: table_read
SELECT {columns} FROM {schema}{table}
-- include: table_where
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
-- The contents without a key that the winning attempts staged more than once. The content
-- hash covers the topic (content_hash in columns.py), so it alone is grouped, bytewise:
-- every staged row of the write is sorted here, and the database's collation (strcoll)
-- took twice as long.
SELECT min(s.topic), s.content_hash COLLATE "C"
FROM {schema}sqlbroker_spark_stage s
JOIN unnest(%(partitions)s::integer[], %(attempts)s::bigint[]) AS w(partition_id, attempt)
  ON w.partition_id = s.partition_id AND w.attempt = s.attempt
WHERE s.job_id = %(job_id)s AND s.idempotency_key IS NULL
GROUP BY 2
HAVING count(*) > 1

-- name: publish_settings
-- For the transaction of one published page. A page of thousands of messages makes the
-- planner's estimates of the publish statement (unnest, a window, fan-out) large enough
-- to JIT-compile it: 0.8 s of compiling for a statement that runs in 0.05 s. And the
-- staging table's statistics lag its rows (a write fills it in seconds): estimated at one
-- row, the page's CTEs were joined by nested loops, 5,000 x 5,000 comparisons.
SELECT set_config('jit', 'off', true), set_config('enable_nestloop', 'off', true)

-- name: publish_settings_reset
-- Before the lookup of keys already taken: an index lookup in the dedupe table.
SELECT set_config('enable_nestloop', 'on', true)

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

-- name: stream_leases
SELECT delivery_id, lease_token::text FROM {schema}sqlbroker_spark_claim
WHERE stream = %(stream)s AND seq <= %(upto_seq)s
ORDER BY delivery_id

-- name: stream_forget
DELETE FROM {schema}sqlbroker_spark_claim WHERE stream = %(stream)s AND seq <= %(upto_seq)s

-- name: stream_acked
UPDATE {schema}sqlbroker_spark_stream SET acked_seq = greatest(acked_seq, %(upto_seq)s)
WHERE name = %(stream)s

-- name: table_export_delete
DELETE FROM {schema}{table} WHERE {time_column} < %(cutoff)s AND id <= %(max_id)s

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

-- ---------------------------------------------------------------------------------------
-- The write's fast path (issue 28 item 5): tasks COPY their rows into the staging table;
-- the driver publishes a page of a task attempt with two statements that never bring a
-- payload back to Python (reserve the keys, then insert with the broker's own routing).

-- name: stage_row_security
-- Whether row security applies to this session's writes to the staging table (a tenant's
-- role under isolation): COPY is refused there.
SELECT row_security_active('{schema}sqlbroker_spark_stage')

-- name: stage_copy
COPY {schema}sqlbroker_spark_stage (
    job_id, partition_id, attempt, seq, topic, payload, content_type, headers, priority,
    ordering_key, idempotency_key, content_hash, max_attempts, dedupe_window, staged_at
) FROM STDIN (FORMAT BINARY)

-- name: stage_page_rows
-- (A fragment.) One page of a task attempt's staged rows with their idempotency keys: the
-- row's own, else the one the driver counted for a content staged more than once (k),
-- else the job's prefix, the content hash and occurrence 0 (see StagedKeys).
SELECT s.seq, s.topic, s.priority, s.ordering_key, s.payload, s.content_type, s.headers,
       s.max_attempts, s.dedupe_window,
       coalesce(s.idempotency_key, k.key, %(key_prefix)s || s.content_hash || '.0')
           AS idempotency_key
FROM {schema}sqlbroker_spark_stage s
LEFT JOIN unnest(%(key_seqs)s::integer[], %(keys)s::text[]) AS k(seq, key) ON k.seq = s.seq
WHERE s.job_id = %(job_id)s AND s.partition_id = %(partition_id)s AND s.attempt = %(attempt)s
  AND s.seq > %(after_seq)s AND s.seq <= %(upto_seq)s

-- name: stage_page_repeated
-- The rows of a page without a key whose content the job staged more than once.
SELECT s.seq, s.topic, s.content_hash
FROM {schema}sqlbroker_spark_stage s
JOIN unnest(%(topics)s::text[], %(hashes)s::text[]) AS r(topic, content_hash)
  ON r.topic = s.topic AND r.content_hash = s.content_hash
WHERE s.job_id = %(job_id)s AND s.partition_id = %(partition_id)s AND s.attempt = %(attempt)s
  AND s.seq > %(after_seq)s AND s.seq <= %(upto_seq)s AND s.idempotency_key IS NULL
ORDER BY s.seq

-- name: stage_page_reserve
-- Reserve the idempotency keys of a page, as dedupe_reserve does (a key is free once it
-- has expired; the payload hash is storage/rows.py's payload_hash), with new message ids
-- in core/message.py's layout (a UUID version 7: milliseconds, then random bits).
-- Returns the page's size; the reserved rows (seq, message id) and their ordering keys;
-- the rows whose key was taken (topic, key, payload hash: the caller checks them with
-- dedupe_get); the first key the page repeats with another payload, and its first id.
-- Every join here is between the page's own CTEs (publish_settings: hash joins).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
page AS MATERIALIZED (
-- include: stage_page_rows
),
hashed AS (
    SELECT h.*, first_value(h.payload_hash) OVER w AS first_hash, row_number() OVER w AS nth
    FROM (
        SELECT p.seq, p.topic, p.idempotency_key, p.ordering_key, p.dedupe_window,
               encode(sha256(convert_to(p.content_type, 'UTF8') || '\x00'::bytea
                             || p.payload), 'hex') AS payload_hash
        FROM page p
    ) h
    WINDOW w AS (PARTITION BY h.topic COLLATE "C", h.idempotency_key COLLATE "C" ORDER BY h.seq)
),
first AS MATERIALIZED (
    SELECT seq, topic, idempotency_key, ordering_key, dedupe_window, payload_hash,
           encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
               PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                 FROM 3)
               FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid AS message_id
    FROM hashed
    WHERE nth = 1
),
reserved AS (
    INSERT INTO {schema}sqlbroker_dedupe AS d (
        topic, idempotency_key, message_id, payload_hash, created_at, expires_at
    )
    SELECT f.topic, f.idempotency_key, f.message_id, f.payload_hash, t.now,
           t.now + make_interval(secs => f.dedupe_window)
    FROM first f, t
    ORDER BY f.topic, f.idempotency_key
    ON CONFLICT (topic, idempotency_key, tenant) DO UPDATE
        SET message_id = excluded.message_id,
            payload_hash = excluded.payload_hash,
            created_at = excluded.created_at,
            expires_at = excluded.expires_at
        WHERE d.expires_at <= excluded.created_at
    RETURNING message_id
),
fresh AS MATERIALIZED (
    SELECT f.seq, f.ordering_key, f.message_id
    FROM first f JOIN reserved r ON r.message_id = f.message_id
),
taken AS MATERIALIZED (
    SELECT f.seq, f.topic, f.idempotency_key, f.payload_hash
    FROM first f
    WHERE NOT EXISTS (SELECT 1 FROM reserved r WHERE r.message_id = f.message_id)
),
repeat AS MATERIALIZED (
    SELECT topic, idempotency_key FROM hashed WHERE payload_hash <> first_hash
    ORDER BY seq LIMIT 1
)
SELECT (SELECT count(*) FROM page),
       ARRAY(SELECT seq FROM fresh ORDER BY seq),
       ARRAY(SELECT message_id::text FROM fresh ORDER BY seq),
       ARRAY(SELECT DISTINCT ordering_key FROM fresh WHERE ordering_key IS NOT NULL ORDER BY 1),
       ARRAY(SELECT topic FROM taken ORDER BY seq),
       ARRAY(SELECT idempotency_key FROM taken ORDER BY seq),
       ARRAY(SELECT payload_hash FROM taken ORDER BY seq),
       (SELECT topic FROM repeat),
       (SELECT idempotency_key FROM repeat),
       (SELECT f.message_id::text FROM first f, repeat r
        WHERE f.topic = r.topic AND f.idempotency_key = r.idempotency_key)

-- name: stage_page_insert
-- The reserved rows of a page as the batch (b) of the broker's publish statement, which
-- stage_publish completes with the broker's own message_insert_routing (one home for the
-- routing rules, included): copies to every matching subscription, unrouted rows archived.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
page AS MATERIALIZED (
-- include: stage_page_rows
),
b AS (
    SELECT p.seq::bigint AS seq, n.message_id, p.topic, p.priority, p.ordering_key,
           p.idempotency_key, p.payload, p.content_type, p.headers, p.max_attempts, t.now,
           t.now AS ready_at, NULL::timestamptz AS expire_at
    FROM t, page p
    JOIN unnest(%(seqs)s::integer[], %(ids)s::uuid[]) AS n(seq, message_id) ON n.seq = p.seq
),
-- include: message_insert_routing

-- ---------------------------------------------------------------------------------------
-- The export's delete by partition (issue 25 item 5): whole days of the time-partitioned
-- archive (migration 0013) are dropped, not deleted row by row.

-- name: export_lock
-- No archive row may enter (a completion) between counting the exported range and
-- removing it; readers go on. Held until the export's transaction ends (well under a
-- second: counting, dropping whole days, deleting what is left).
LOCK TABLE {schema}sqlbroker_archive IN SHARE ROW EXCLUSIVE MODE

-- name: export_partitions
-- Per partition holding rows of the exported range: its rows there, its largest id, and
-- its upper bound (NULL for the default partition and for one that reaches the cutoff,
-- which therefore also holds rows that are not exported).
SELECT p.name, p.rows, p.max_id,
       CASE WHEN p.upper <= %(cutoff)s THEN p.upper END
FROM (
    SELECT a.tableoid::regclass::text AS name, count(*) AS rows, max(a.id) AS max_id,
           substring(pg_catalog.pg_get_expr(c.relpartbound, c.oid)
                     FROM 'TO \(''([^'']*)''\)')::timestamptz AS upper
    FROM {schema}sqlbroker_archive a
    JOIN pg_catalog.pg_class c ON c.oid = a.tableoid
    WHERE a.finished_at < %(cutoff)s
    GROUP BY a.tableoid, c.oid, c.relpartbound
) p

-- name: export_drop_days
-- Drop the daily partitions that end at or before drop_before (the migration's
-- maintenance function: it runs as the owner, skips a day it cannot lock at once, and a
-- tenant-bound caller's days that hold rows); returns how many it dropped.
SELECT ({schema}sqlbroker_archive_maintain(NULL, 0, %(drop_before)s))[2]

-- name: export_partition_exists
SELECT to_regclass(%(name)s) IS NOT NULL


-- name: stream_claim_leases
-- The broker's claim (message_claim of storage/postgres/queries.sql, included as it is),
-- returning only what a stream keeps: ids and lease tokens, no row to decode.
WITH claimed AS (
-- include: message_claim
)
SELECT id, lease_token FROM claimed

-- name: stream_promote
-- include: message_promote_scheduled

-- name: stage_dedupe_get
-- include: dedupe_get

-- name: stage_key_lock
-- include: key_lock

-- ---------------------------------------------------------------------------------------
-- The stream's executor read through ADBC (issue 28 item 4): Arrow all the way, like the
-- batch reads above, instead of a Python object per value.

-- name: stream_read
-- The same columns as a batch read of messages, as they were when claimed. Positional
-- parameters: $1 stream, $2/$3 the sequence range (after, upto], $4 parts, $5 part.
SELECT {stream_columns}
FROM {schema}sqlbroker_spark_claim
WHERE stream = $1 AND seq > $2 AND seq <= $3 AND delivery_id % $4 = $5
ORDER BY seq, delivery_id

-- ---------------------------------------------------------------------------------------
-- The export's check against the database (issue 28 item 6): per topic, the rows that
-- <table>_export_delete would remove now, counted here instead of read again through Spark.

-- name: table_export_totals
SELECT topic, count(*), sum(id), min(id), max(id) FROM {schema}{table}
WHERE {time_column} < %(cutoff)s AND id <= %(max_id)s
GROUP BY topic
