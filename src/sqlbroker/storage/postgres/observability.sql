-- Observability (PostgreSQL): worker heartbeats, per-minute counters and the audit trail.

-- name: worker_upsert
INSERT INTO {schema}sqlbroker_worker AS w
    (name, host, pid, subscriptions, started_at, seen_at, stopped_at)
SELECT %(name)s, %(host)s, %(pid)s, %(subscriptions)s, t.now, t.now,
       CASE WHEN %(stopping)s THEN t.now END
FROM (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now) AS t
-- tenant: names are per tenant (migration 0009; '' unless tenants are enabled)
ON CONFLICT (name, tenant) DO UPDATE SET
    host = excluded.host,
    pid = excluded.pid,
    subscriptions = excluded.subscriptions,
    started_at = CASE WHEN %(starting)s THEN excluded.started_at ELSE w.started_at END,
    seen_at = excluded.seen_at,
    stopped_at = excluded.stopped_at
RETURNING seen_at

-- name: metric_minute_upsert_many
-- One row per position of the arrays (column by column, of the same length).
INSERT INTO {schema}sqlbroker_metric_minute (
    subscription, minute, worker, completed, retried, dead,
    handler_count, handler_seconds, handler_buckets
)
SELECT * FROM unnest(
    %(subscriptions)s::text[], %(minutes)s::timestamptz[], %(workers)s::text[],
    %(completed)s::bigint[], %(retried)s::bigint[], %(dead)s::bigint[],
    %(handler_counts)s::bigint[], %(handler_seconds)s::float8[], %(handler_buckets)s::text[]
)
-- tenant: counters are per tenant (migration 0011; '' unless tenants are enabled)
ON CONFLICT (subscription, minute, worker, tenant) DO UPDATE SET
    completed = excluded.completed,
    retried = excluded.retried,
    dead = excluded.dead,
    handler_count = excluded.handler_count,
    handler_seconds = excluded.handler_seconds,
    handler_buckets = excluded.handler_buckets

-- name: metric_total_add_many
INSERT INTO {schema}sqlbroker_metric_total AS t (subscription, outcome, count)
SELECT * FROM unnest(%(subscriptions)s::text[], %(outcomes)s::text[], %(deltas)s::bigint[])
ON CONFLICT (subscription, outcome, tenant) DO UPDATE SET count = t.count + excluded.count

-- name: worker_list
-- An infinite seen_at (raw SQL) has no age: NULL, which the row decoder marks damaged.
SELECT name, host, pid, subscriptions, started_at, seen_at, stopped_at,
       CASE WHEN isfinite(seen_at) THEN greatest(0.0, extract(epoch FROM
           coalesce(%(now)s::timestamptz, statement_timestamp()) - seen_at))::float8
       END AS seen_age
FROM {schema}sqlbroker_worker
ORDER BY seen_at DESC, name

-- name: metric_minutes
SELECT subscription, minute, worker, completed, retried, dead,
       handler_count, handler_seconds, handler_buckets
FROM {schema}sqlbroker_metric_minute
WHERE minute >= %(since)s
ORDER BY minute, subscription, worker

-- name: metric_totals
SELECT subscription, outcome, count FROM {schema}sqlbroker_metric_total

-- name: archive_rare_counts
SELECT outcome, subscription, count(*) AS total,
       count(*) FILTER (WHERE finished_at >= %(since)s) AS recent
FROM {schema}sqlbroker_archive
WHERE outcome IN ('expired', 'unrouted')
GROUP BY outcome, subscription
ORDER BY outcome, subscription

-- name: metric_minute_trim
DELETE FROM {schema}sqlbroker_metric_minute
WHERE (subscription, minute, worker) IN (
    SELECT subscription, minute, worker FROM {schema}sqlbroker_metric_minute
    WHERE minute < %(older_than)s
    LIMIT %(limit)s
)

-- name: worker_trim
DELETE FROM {schema}sqlbroker_worker WHERE seen_at < %(older_than)s

-- name: audit_list
SELECT id, at, actor, action, detail
FROM {schema}sqlbroker_audit
WHERE %(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint
ORDER BY id DESC
LIMIT %(limit)s
