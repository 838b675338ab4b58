-- Observability (SQLite): worker heartbeats, per-minute counters and the audit trail.
-- Times are REAL seconds since the Unix epoch, UTC.

-- name: worker_upsert
INSERT INTO sqlbroker_worker (name, host, pid, subscriptions, started_at, seen_at, stopped_at)
VALUES (:name, :host, :pid, :subscriptions, :now, :now, CASE WHEN :stopping THEN :now END)
ON CONFLICT (name) DO UPDATE SET
    host = excluded.host,
    pid = excluded.pid,
    subscriptions = excluded.subscriptions,
    started_at = CASE WHEN :starting THEN excluded.started_at ELSE sqlbroker_worker.started_at END,
    seen_at = excluded.seen_at,
    stopped_at = excluded.stopped_at
RETURNING seen_at

-- name: metric_minute_upsert_many
-- One row per position of the JSON arrays (column by column, of the same length).
INSERT INTO sqlbroker_metric_minute (
    subscription, minute, worker, completed, retried, dead,
    handler_count, handler_seconds, handler_buckets
)
SELECT s.value,
       json_extract(:minutes, '$[' || s.key || ']'),
       json_extract(:workers, '$[' || s.key || ']'),
       json_extract(:completed, '$[' || s.key || ']'),
       json_extract(:retried, '$[' || s.key || ']'),
       json_extract(:dead, '$[' || s.key || ']'),
       json_extract(:handler_counts, '$[' || s.key || ']'),
       json_extract(:handler_seconds, '$[' || s.key || ']'),
       json_extract(:handler_buckets, '$[' || s.key || ']')
FROM json_each(:subscriptions) s
WHERE true  -- an upsert's SELECT needs a WHERE (SQLite's parser)
ON CONFLICT (subscription, minute, worker) DO UPDATE SET
    completed = excluded.completed,
    retried = excluded.retried,
    dead = excluded.dead,
    handler_count = excluded.handler_count,
    handler_seconds = excluded.handler_seconds,
    handler_buckets = excluded.handler_buckets

-- name: metric_total_add_many
INSERT INTO sqlbroker_metric_total (subscription, outcome, count)
SELECT s.value,
       json_extract(:outcomes, '$[' || s.key || ']'),
       json_extract(:deltas, '$[' || s.key || ']')
FROM json_each(:subscriptions) s
WHERE true
ON CONFLICT (subscription, outcome) DO UPDATE SET count = count + excluded.count

-- name: worker_list
SELECT name, host, pid, subscriptions, started_at, seen_at, stopped_at,
       max(0.0, :now - seen_at) AS seen_age
FROM sqlbroker_worker
ORDER BY seen_at DESC, name

-- name: metric_minutes
SELECT subscription, minute, worker, completed, retried, dead,
       handler_count, handler_seconds, handler_buckets
FROM sqlbroker_metric_minute
WHERE minute >= :since
ORDER BY minute, subscription, worker

-- name: metric_totals
SELECT subscription, outcome, count FROM sqlbroker_metric_total

-- name: archive_rare_counts
SELECT outcome, subscription, count(*) AS total,
       coalesce(sum(finished_at >= :since), 0) AS recent
FROM sqlbroker_archive INDEXED BY sqlbroker_archive_rare
WHERE outcome IN ('expired', 'unrouted')
GROUP BY outcome, subscription
ORDER BY outcome, subscription

-- name: metric_minute_trim
DELETE FROM sqlbroker_metric_minute
WHERE (subscription, minute, worker) IN (
    SELECT subscription, minute, worker FROM sqlbroker_metric_minute
    WHERE minute < :older_than
    LIMIT :limit
)

-- name: worker_trim
DELETE FROM sqlbroker_worker WHERE seen_at < :older_than

-- name: audit_list
SELECT id, at, actor, action, detail
FROM sqlbroker_audit
WHERE :before_id IS NULL OR id < :before_id
ORDER BY id DESC
LIMIT :limit
