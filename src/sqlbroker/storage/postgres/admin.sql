-- Listings and the operator's actions (storage/operations/admin.py).

-- name: message_list
SELECT * FROM (
    SELECT id, message_id::text AS message_id, subscription, topic,
           CASE WHEN state = 'scheduled'
                 AND available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
                THEN 'available' ELSE state END AS state,
           priority, ordering_key, attempts, max_attempts, enqueued_at, available_at,
           expires_at, lease_expires_at, last_error
    FROM {schema}sqlbroker_message
    WHERE (%(subscription)s::text IS NULL OR subscription = %(subscription)s::text)
) m
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
ORDER BY id
LIMIT %(limit)s

-- name: dead_where
WHERE (%(ids)b::bigint[] IS NULL OR id = ANY (%(ids)b::bigint[]))
  AND (%(subscription)s::text IS NULL OR subscription = %(subscription)s::text)
  AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(error_type)s::text IS NULL OR error_type = ANY(%(error_types)s::text[])
       OR right(error_type, length(%(error_suffix)s::text)) = %(error_suffix)s::text)
  AND (%(reason_contains)s::text IS NULL OR strpos(reason, %(reason_contains)s::text) > 0)
  AND (%(dead_before)s::timestamptz IS NULL OR dead_at < %(dead_before)s::timestamptz)
  AND (%(dead_after)s::timestamptz IS NULL OR dead_at >= %(dead_after)s::timestamptz)

-- name: dead_select
SELECT id, message_id::text, subscription, topic, payload, content_type, headers, priority,
       ordering_key, idempotency_key, attempts, max_attempts, replay_count, reason,
       error_type, error_message, traceback, enqueued_at, first_started_at, first_failed_at,
       last_failed_at, dead_at
FROM {schema}sqlbroker_dead
-- include: dead_where
  AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s::bigint)
ORDER BY id
LIMIT %(limit)s

-- name: dead_lock
SELECT id FROM {schema}sqlbroker_dead
-- include: dead_where
ORDER BY id
FOR UPDATE

-- name: dead_keys
SELECT DISTINCT ordering_key FROM {schema}sqlbroker_dead
WHERE ordering_key IS NOT NULL AND id = ANY (%(ids)s::bigint[])

-- name: dead_subscriptions_ensure
INSERT INTO {schema}sqlbroker_subscription (name, created_at)
SELECT DISTINCT subscription, coalesce(%(now)s::timestamptz, statement_timestamp())
FROM {schema}sqlbroker_dead WHERE id = ANY (%(ids)s::bigint[])
ON CONFLICT (name) DO NOTHING

-- name: dead_replay_insert
-- A copy with an ordering key waits (blocked) behind any copy of its key still queued, and
-- behind the earlier of its own replayed siblings.
INSERT INTO {schema}sqlbroker_message (
    message_id, subscription, topic, state, priority, ordering_key, idempotency_key,
    payload, content_type, headers, attempts, max_attempts, replay_count, enqueued_at,
    available_at, expires_at
)
SELECT d.message_id, d.subscription, d.topic,
       CASE WHEN d.ordering_key IS NOT NULL AND (
                EXISTS (SELECT 1 FROM {schema}sqlbroker_message o
                        WHERE o.subscription = d.subscription AND o.ordering_key = d.ordering_key)
                OR row_number() OVER (PARTITION BY d.subscription, d.ordering_key ORDER BY d.id) > 1
            ) THEN 'blocked' ELSE 'available' END,
       d.priority, d.ordering_key, d.idempotency_key, d.payload, d.content_type, d.headers, 0,
       d.max_attempts, d.replay_count + 1, d.enqueued_at,
       coalesce(%(now)s::timestamptz, statement_timestamp()), NULL
FROM {schema}sqlbroker_dead d
WHERE d.id = ANY (%(ids)s::bigint[])
ORDER BY d.id
RETURNING id, subscription

-- name: dead_delete_ids
DELETE FROM {schema}sqlbroker_dead WHERE id = ANY (%(ids)s::bigint[])

-- name: audit_insert
INSERT INTO {schema}sqlbroker_audit (at, actor, action, detail)
VALUES (coalesce(%(now)s::timestamptz, statement_timestamp()), %(actor)s, %(action)s, %(detail)s)

-- name: notify_many
SELECT pg_notify(%(channel)s, payload) FROM unnest(%(payloads)s::text[]) AS payload

-- name: archive_list
SELECT id, message_id::text, subscription, topic, payload, content_type, headers, priority,
       ordering_key, outcome, attempts, replay_count, enqueued_at, first_started_at, finished_at
FROM {schema}sqlbroker_archive
WHERE (%(subscription)s::text IS NULL OR subscription = %(subscription)s::text)
  AND (%(outcome)s::text IS NULL OR outcome = %(outcome)s::text)
  AND (%(message_id)s::uuid IS NULL OR message_id = %(message_id)s::uuid)
ORDER BY id DESC
LIMIT %(limit)s

-- name: stats
WITH hot AS (
    SELECT subscription,
           count(*) FILTER (WHERE state = 'available' OR (state = 'scheduled' AND due)) AS ready,
           count(*) FILTER (WHERE state = 'scheduled' AND NOT due) AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'blocked') AS blocked,
           min(available_at) FILTER (WHERE state = 'available' OR (state = 'scheduled' AND due)) AS oldest
    FROM (
        -- A scheduled copy whose time has come is ready: the next claim promotes it.
        SELECT subscription, state, available_at,
               available_at <= coalesce(%(now)s::timestamptz, statement_timestamp()) AS due
        FROM {schema}sqlbroker_message
    ) m
    GROUP BY subscription
),
dead AS (SELECT subscription, count(*) AS dead FROM {schema}sqlbroker_dead GROUP BY subscription),
names AS (
    SELECT name FROM {schema}sqlbroker_subscription
    UNION SELECT subscription FROM hot
    UNION SELECT subscription FROM dead
)
SELECT n.name, coalesce(h.ready, 0), coalesce(h.scheduled, 0), coalesce(h.running, 0),
       coalesce(h.blocked, 0), coalesce(d.dead, 0),
       CASE WHEN h.oldest IS NOT NULL THEN greatest(0, extract(epoch FROM
           coalesce(%(now)s::timestamptz, statement_timestamp()) - h.oldest))::float8 END,
       coalesce((SELECT s.paused FROM {schema}sqlbroker_subscription s WHERE s.name = n.name), false)
FROM names n
LEFT JOIN hot h ON h.subscription = n.name
LEFT JOIN dead d ON d.subscription = n.name
ORDER BY n.name
