-- PostgreSQL queries of sqlbroker. psycopg named parameters; batches travel as arrays and
-- are read with unnest. %(now)s is NULL unless a test clock overrides the database clock.

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS {schema}sqlbroker_schema_version (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT statement_timestamp()
)

-- name: migrate_lock
SELECT pg_advisory_xact_lock(7262706672350731337)

-- name: schema_exists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s)

-- name: schema_version_exists
SELECT to_regclass('{schema}sqlbroker_schema_version') IS NOT NULL

-- name: schema_version
SELECT coalesce(max(version), 0) FROM {schema}sqlbroker_schema_version

-- name: schema_version_insert
INSERT INTO {schema}sqlbroker_schema_version (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_version_printed
-- The version row of one migration in the printed schema (``sqlbroker schema --print``),
-- which runs with no parameters: {version} and {name} come from the migration's file name.
INSERT INTO {schema}sqlbroker_schema_version (version, name) VALUES ({version}, '{name}')

-- name: connection_identity
-- What a caller's connection (conn=) must share with the broker's own: the database, the
-- server (its start time: two servers with a database of one name differ there) and the
-- message table its search_path finds. Never fails, so it cannot abort the caller's
-- transaction.
SELECT current_database(), pg_postmaster_start_time(),
       to_regclass('{schema}sqlbroker_message')::oid::bigint

-- name: savepoint
SAVEPOINT sqlbroker

-- name: savepoint_release
RELEASE SAVEPOINT sqlbroker

-- name: savepoint_rollback
ROLLBACK TO SAVEPOINT sqlbroker; RELEASE SAVEPOINT sqlbroker

-- name: now
SELECT coalesce(%(now)s::timestamptz, statement_timestamp())

-- name: health_check
SELECT 1

-- The next two blocks take a quoted identifier, composed by psycopg into {channel} and
-- {name} (neither statement takes a parameter). schema_create runs only when the schema
-- is missing: IF NOT EXISTS still needs CREATE on the database, which a migrator owning
-- just its schema lacks.

-- name: listen
LISTEN {channel}

-- name: schema_create
CREATE SCHEMA IF NOT EXISTS {name}

-- name: subscription_insert
INSERT INTO {schema}sqlbroker_subscription (name, created_at)
VALUES (%(name)s, coalesce(%(now)s::timestamptz, statement_timestamp()))
ON CONFLICT (name) DO NOTHING

-- name: subscription_patterns_clear
DELETE FROM {schema}sqlbroker_subscription_pattern WHERE subscription = %(name)s

-- name: subscription_patterns_insert
INSERT INTO {schema}sqlbroker_subscription_pattern (subscription, pattern, regex)
SELECT %(name)s, p.pattern, p.regex
FROM unnest(%(patterns)b::text[], %(regexes)b::text[]) AS p(pattern, regex)
ON CONFLICT (subscription, pattern) DO NOTHING

-- name: subscription_get
SELECT s.name, s.created_at, p.pattern
FROM {schema}sqlbroker_subscription s
LEFT JOIN {schema}sqlbroker_subscription_pattern p ON p.subscription = s.name
WHERE s.name = %(name)s
ORDER BY p.pattern

-- name: subscription_list
SELECT s.name, s.created_at, p.pattern
FROM {schema}sqlbroker_subscription s
LEFT JOIN {schema}sqlbroker_subscription_pattern p ON p.subscription = s.name
ORDER BY s.name, p.pattern

-- name: subscription_delete
WITH gone AS (DELETE FROM {schema}sqlbroker_message WHERE subscription = %(name)s)
DELETE FROM {schema}sqlbroker_subscription WHERE name = %(name)s

-- name: subscription_room
-- What the limits are checked against (core/limits.py): the patterns of one subscription
-- and the totals of the database, inside the transaction that just wrote them.
SELECT (SELECT count(*) FROM {schema}sqlbroker_subscription_pattern WHERE subscription = %(name)s),
       (SELECT count(*) FROM {schema}sqlbroker_subscription),
       (SELECT count(*) FROM {schema}sqlbroker_subscription_pattern)

-- name: dedupe_reserve
WITH b AS (
    SELECT * FROM unnest(%(topic)b::text[], %(idempotency_key)b::text[], %(message_id)b::uuid[],
                         %(payload_hash)b::text[], %(window)b::float8[])
        AS b(topic, idempotency_key, message_id, payload_hash, window_seconds)
)
INSERT INTO {schema}sqlbroker_dedupe AS d (topic, idempotency_key, message_id, payload_hash, created_at, expires_at)
SELECT b.topic, b.idempotency_key, b.message_id, b.payload_hash,
       coalesce(%(now)s::timestamptz, statement_timestamp()),
       coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => b.window_seconds)
FROM b
ORDER BY b.topic, b.idempotency_key
-- tenant: keys are per tenant (migration 0007; '' unless tenants are enabled)
ON CONFLICT (topic, idempotency_key, tenant) DO UPDATE
    SET message_id = excluded.message_id,
        payload_hash = excluded.payload_hash,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE d.expires_at <= excluded.created_at
RETURNING topic, idempotency_key

-- name: dedupe_get
SELECT d.topic, d.idempotency_key, d.message_id::text, d.payload_hash
FROM {schema}sqlbroker_dedupe d
JOIN unnest(%(topic)b::text[], %(idempotency_key)b::text[]) AS b(topic, idempotency_key)
  ON d.topic = b.topic AND d.idempotency_key = b.idempotency_key

-- name: dedupe_trim
DELETE FROM {schema}sqlbroker_dedupe
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}sqlbroker_dedupe
    WHERE expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
    LIMIT %(limit)s
))

-- name: message_insert
-- One statement for a whole batch (arrays: see message_batch); see message_insert_routing.
-- include: message_batch
-- include: message_insert_routing

-- name: message_batch
-- (A fragment, included above and below.) The rows of a batch: message_id and payload are
-- arrays of one element per row, read with unnest; every other column is such an array or
-- one element that stands for every row (operations/publishing.py sends a column whose
-- values are all equal so: the driver encodes one value instead of hundreds).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
u AS (
    SELECT u.message_id, u.payload, u.seq,
           (%(topic)b::text[])[least(u.seq, cardinality(%(topic)b::text[]))] AS topic,
           (%(priority)b::smallint[])[least(u.seq, cardinality(%(priority)b::smallint[]))] AS priority,
           (%(ordering_key)b::text[])[least(u.seq, cardinality(%(ordering_key)b::text[]))] AS ordering_key,
           (%(idempotency_key)b::text[])[least(u.seq, cardinality(%(idempotency_key)b::text[]))] AS idempotency_key,
           (%(content_type)b::text[])[least(u.seq, cardinality(%(content_type)b::text[]))] AS content_type,
           (%(headers)b::text[])[least(u.seq, cardinality(%(headers)b::text[]))] AS headers,
           (%(max_attempts)b::integer[])[least(u.seq, cardinality(%(max_attempts)b::integer[]))] AS max_attempts,
           (%(at)b::timestamptz[])[least(u.seq, cardinality(%(at)b::timestamptz[]))] AS at,
           (%(delay)b::float8[])[least(u.seq, cardinality(%(delay)b::float8[]))] AS delay,
           (%(expires)b::timestamptz[])[least(u.seq, cardinality(%(expires)b::timestamptz[]))] AS expires,
           (%(ttl)b::float8[])[least(u.seq, cardinality(%(ttl)b::float8[]))] AS ttl
    FROM unnest(%(message_id)b::uuid[], %(payload)b::bytea[])
        WITH ORDINALITY AS u(message_id, payload, seq)
),
b AS (
    SELECT u.*, t.now,
           coalesce(u.at, t.now + make_interval(secs => coalesce(u.delay, 0))) AS ready_at,
           coalesce(u.expires, t.now + make_interval(secs => u.ttl)) AS expire_at
    FROM t, u
),

-- name: message_insert_one
-- The same for one message, with scalar parameters: unlike unnest over an array, whose
-- row estimate differs between custom and generic plans, this gets a cached generic plan
-- instead of being planned again on every send.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
b AS (
    SELECT %(message_id)s::uuid AS message_id, %(topic)s::text AS topic,
           %(priority)s::smallint AS priority, %(ordering_key)s::text AS ordering_key,
           %(idempotency_key)s::text AS idempotency_key, %(payload)s::bytea AS payload,
           %(content_type)s::text AS content_type, %(headers)s::text AS headers,
           %(max_attempts)s::integer AS max_attempts, 1::bigint AS seq, t.now,
           coalesce(%(at)s::timestamptz,
                    t.now + make_interval(secs => coalesce(%(delay)s::float8, 0))) AS ready_at,
           coalesce(%(expires)s::timestamptz,
                    t.now + make_interval(secs => %(ttl)s::float8)) AS expire_at
    FROM t
),
-- include: message_insert_routing

-- name: message_insert_routing
-- (A fragment, included above.) Copies go direct to %(subscription)s when it is given,
-- creating that queue on first use, otherwise fan out to every subscription with a matching
-- pattern; unmatched messages are archived as unrouted. Workers of each subscription that
-- got claimable work are notified (at commit).
-- include: queue_on_first_use
routes AS (
    SELECT b.seq, %(subscription)s::text AS subscription FROM b WHERE %(subscription)s::text IS NOT NULL
    UNION ALL
    SELECT b.seq, m.subscription
    FROM b
    JOIN (
    -- Each distinct topic of the batch is matched once (a batch of one topic: once).
    SELECT DISTINCT t.topic, p.subscription
    FROM (SELECT DISTINCT b.topic, split_part(b.topic, '.', 1) || '.' AS head,
                 '.' || reverse(split_part(reverse(b.topic), '.', 1)) AS tail
          FROM b) t
    JOIN {schema}sqlbroker_subscription_pattern p ON CASE
        -- Routing matches the stored pattern, never the stored regex (a row damaged by
        -- raw SQL could hold any regex). Cheap tests first, as in SQLite's message_routes,
        -- so that most patterns never reach the regex: a matching pattern's first segment
        -- is '*', '#' or the topic's first word (head: that word and a dot), its last
        -- segment '*', '#' or the topic's last word (tail: a dot and that word).
        WHEN p.pattern = t.topic OR p.pattern = '#' THEN true
        WHEN p.pattern = '*' THEN strpos(t.topic, '.') = 0
        WHEN NOT (left(p.pattern, length(t.head)) = t.head OR left(p.pattern, 2) IN ('*.', '#.'))
            THEN false
        WHEN NOT (right(p.pattern, length(t.tail)) = t.tail OR right(p.pattern, 2) IN ('.*', '.#'))
            THEN false
        -- Only a valid pattern (validate_pattern's rule) routes: a damaged one matches
        -- nothing. Its regex is core/topics.py's pattern_regex, built here from the
        -- pattern (tests/conformance/test_routing_sql.py holds routing to the reference).
        WHEN length(p.pattern) > 255
          OR p.pattern !~ '^(\*|#|[A-Za-z0-9_-]{1,64})(\.(\*|#|[A-Za-z0-9_-]{1,64}))*$'
          THEN false
        ELSE ('.' || t.topic) ~ ('^' || replace(replace(replace(
                 '.' || regexp_replace(p.pattern, '#(\.#)+', '#', 'g'),
                 '.', '\.'), '\.*', '\.[^.]+'), '\.#', '(\.[^.]+)*') || '$')
    END
    ) m ON m.topic = b.topic
    WHERE %(subscription)s::text IS NULL
),
-- The copy limit (core/limits.py, max_copies): past it nothing below is written and the
-- caller raises LimitExceeded from the count.
fits AS (SELECT count(*) AS copies, count(*) <= %(max_copies)s AS ok FROM routes),
ins AS (
    INSERT INTO {schema}sqlbroker_message (
        message_id, subscription, topic, state, priority, ordering_key, idempotency_key,
        payload, content_type, headers, max_attempts, enqueued_at, available_at, expires_at
    )
    SELECT b.message_id, r.subscription, b.topic,
           CASE WHEN b.ordering_key IS NOT NULL AND (
                    EXISTS (SELECT 1 FROM {schema}sqlbroker_message o
                            WHERE o.subscription = r.subscription AND o.ordering_key = b.ordering_key)
                    OR row_number() OVER (PARTITION BY r.subscription, b.ordering_key ORDER BY b.seq) > 1
                ) THEN 'blocked'
                WHEN b.ready_at > b.now THEN 'scheduled' ELSE 'available' END,
           b.priority, b.ordering_key, b.idempotency_key, b.payload, b.content_type, b.headers,
           b.max_attempts, b.now, b.ready_at, b.expire_at
    FROM b JOIN routes r ON r.seq = b.seq
    -- Creates the queue before the first copy goes in (an unreferenced CTE would run only
    -- after the main query): with tenants, a copy may only enter an existing subscription.
    WHERE (SELECT ok FROM fits) AND (SELECT count(*) FROM queue) >= 0
    ORDER BY b.seq, r.subscription
    RETURNING subscription, state
),
unrouted AS (
    INSERT INTO {schema}sqlbroker_archive (
        message_id, topic, outcome, priority, ordering_key, idempotency_key, payload,
        content_type, headers, attempts, max_attempts, replay_count, enqueued_at, finished_at
    )
    SELECT b.message_id, b.topic, 'unrouted', b.priority, b.ordering_key, b.idempotency_key,
           b.payload, b.content_type, b.headers, 0, b.max_attempts, 0, b.now, b.now
    FROM b
    WHERE NOT EXISTS (SELECT 1 FROM routes r WHERE r.seq = b.seq) AND (SELECT ok FROM fits)
    ORDER BY b.seq
    RETURNING 1
)
SELECT (SELECT count(*) FROM unrouted) AS unrouted,
       (SELECT count(*) FROM (
            SELECT pg_notify(%(channel)s, s.subscription)
            FROM (SELECT DISTINCT subscription FROM ins WHERE state = 'available') s
       ) n) AS notified,
       (SELECT copies FROM fits) AS copies

-- name: message_insert_queue
-- message_insert for a queue publish without ordering keys (the common case): every copy
-- goes to %(subscription)s, none is blocked or unrouted, so the routing join, the window
-- over keys and the unrouted anti-join of message_insert_routing are left out.
-- include: message_batch
-- include: message_insert_direct

-- name: message_insert_queue_shared
-- message_insert_queue for a batch whose columns other than message_id and payload hold
-- one value for every message (a send_many: its options are shared): those come as
-- scalar parameters, so only the two arrays are unnested. Every copy then has one
-- available time and so one state, worked out once (t), and whether to wake the queue's
-- workers follows from it: the insert returns no rows (message_insert_direct works out
-- each copy's state and keeps every row for the notify).
WITH t AS (
    SELECT r.now, r.ready_at,
           CASE WHEN r.ready_at > r.now THEN 'scheduled' ELSE 'available' END AS state,
           coalesce(%(expires)s::timestamptz,
                    r.now + make_interval(secs => %(ttl)s::float8)) AS expire_at
    FROM (
        SELECT n.now,
               coalesce(%(at)s::timestamptz,
                        n.now + make_interval(secs => coalesce(%(delay)s::float8, 0))) AS ready_at
        FROM (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now) n
    ) r
),
-- include: queue_on_first_use
ins AS (
    INSERT INTO {schema}sqlbroker_message (
        message_id, subscription, topic, state, priority, idempotency_key, payload,
        content_type, headers, max_attempts, enqueued_at, available_at, expires_at
    )
    SELECT u.message_id, %(subscription)s::text, %(topic)s::text, (SELECT state FROM t),
           %(priority)s::smallint, %(idempotency_key)s::text, u.payload,
           %(content_type)s::text, %(headers)s::text, %(max_attempts)s::integer,
           (SELECT now FROM t), (SELECT ready_at FROM t), (SELECT expire_at FROM t)
    -- t's values once each (no join: the copies go in in the batch's order, by seq, with
    -- no sort)
    FROM unnest(%(message_id)b::uuid[], %(payload)b::bytea[])
        WITH ORDINALITY AS u(message_id, payload, seq)
    WHERE (SELECT count(*) FROM queue) >= 0  -- the queue first, see message_insert_routing
    ORDER BY u.seq
)
SELECT 0 AS unrouted,
       (SELECT count(*) FROM (
            SELECT pg_notify(%(channel)s, %(subscription)s::text) FROM t
            WHERE t.state = 'available'
       ) n) AS notified

-- name: message_insert_shared
-- message_insert for a batch whose columns other than message_id and payload hold one
-- value for every message (publish_many of one topic without options, send_many with a
-- key): those come as scalar parameters, as in message_insert_queue_shared, instead of
-- each row picking its values out of eleven arrays (a tenth of the statement's time).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
b AS (
    SELECT u.message_id, u.payload, u.seq, t.now, %(topic)s::text AS topic,
           %(priority)s::smallint AS priority, %(ordering_key)s::text AS ordering_key,
           %(idempotency_key)s::text AS idempotency_key,
           %(content_type)s::text AS content_type, %(headers)s::text AS headers,
           %(max_attempts)s::integer AS max_attempts,
           coalesce(%(at)s::timestamptz,
                    t.now + make_interval(secs => coalesce(%(delay)s::float8, 0))) AS ready_at,
           coalesce(%(expires)s::timestamptz,
                    t.now + make_interval(secs => %(ttl)s::float8)) AS expire_at
    FROM t, unnest(%(message_id)b::uuid[], %(payload)b::bytea[])
        WITH ORDINALITY AS u(message_id, payload, seq)
),
-- include: message_insert_routing

-- name: message_insert_queue_one
-- message_insert_queue for one message, with scalar parameters (a cached generic plan).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
b AS (
    SELECT %(message_id)s::uuid AS message_id, %(topic)s::text AS topic,
           %(priority)s::smallint AS priority, %(idempotency_key)s::text AS idempotency_key,
           %(payload)s::bytea AS payload, %(content_type)s::text AS content_type,
           %(headers)s::text AS headers, %(max_attempts)s::integer AS max_attempts,
           1::bigint AS seq, t.now,
           coalesce(%(at)s::timestamptz,
                    t.now + make_interval(secs => coalesce(%(delay)s::float8, 0))) AS ready_at,
           coalesce(%(expires)s::timestamptz,
                    t.now + make_interval(secs => %(ttl)s::float8)) AS expire_at
    FROM t
),
-- include: message_insert_direct

-- name: message_insert_keyed_one
-- A queue publish of one message with an ordering key (the key's lock is held: key_lock):
-- message_insert_queue_one plus the key's rule, without the routing, the window over a
-- batch's keys and the unrouted anti-join of message_insert_routing. The copy starts
-- blocked when its key has a copy in the queue (a head whose removal commits meanwhile
-- promotes this copy: a promotion that finds none takes the key's lock and looks again).
-- Same result columns as message_insert_routing.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now),
b AS (
    SELECT coalesce(%(at)s::timestamptz,
                    t.now + make_interval(secs => coalesce(%(delay)s::float8, 0))) AS ready_at,
           t.now
    FROM t
),
-- include: queue_on_first_use
ins AS (
    INSERT INTO {schema}sqlbroker_message (
        message_id, subscription, topic, state, priority, ordering_key, idempotency_key,
        payload, content_type, headers, max_attempts, enqueued_at, available_at, expires_at
    )
    SELECT %(message_id)s::uuid, %(subscription)s::text, %(topic)s::text,
           CASE WHEN EXISTS (SELECT 1 FROM {schema}sqlbroker_message o
                             WHERE o.subscription = %(subscription)s::text
                               AND o.ordering_key = %(ordering_key)s::text) THEN 'blocked'
                WHEN b.ready_at > b.now THEN 'scheduled' ELSE 'available' END,
           %(priority)s::smallint, %(ordering_key)s::text, %(idempotency_key)s::text,
           %(payload)s::bytea, %(content_type)s::text, %(headers)s::text,
           %(max_attempts)s::integer, b.now, b.ready_at,
           coalesce(%(expires)s::timestamptz, b.now + make_interval(secs => %(ttl)s::float8))
    FROM b
    WHERE (SELECT count(*) FROM queue) >= 0  -- the queue first, see message_insert_routing
    RETURNING state
)
SELECT 0 AS unrouted,
       (SELECT count(*) FROM (
            SELECT pg_notify(%(channel)s, %(subscription)s::text)
            WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'available')
       ) n) AS notified,
       (SELECT count(*) FROM ins) AS copies

-- name: message_insert_direct
-- (A fragment, included above.) The queue is created on first use, as in
-- message_insert_routing; its workers are notified (at commit) when a copy is claimable.
-- include: queue_on_first_use
ins AS (
    INSERT INTO {schema}sqlbroker_message (
        message_id, subscription, topic, state, priority, idempotency_key, payload,
        content_type, headers, max_attempts, enqueued_at, available_at, expires_at
    )
    SELECT b.message_id, %(subscription)s::text, b.topic,
           CASE WHEN b.ready_at > b.now THEN 'scheduled' ELSE 'available' END,
           b.priority, b.idempotency_key, b.payload, b.content_type, b.headers,
           b.max_attempts, b.now, b.ready_at, b.expire_at
    FROM b
    WHERE (SELECT count(*) FROM queue) >= 0  -- the queue first, see message_insert_routing
    ORDER BY b.seq
    RETURNING state
)
SELECT 0 AS unrouted,
       (SELECT count(*) FROM (
            SELECT pg_notify(%(channel)s, %(subscription)s::text)
            WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'available')
       ) n) AS notified

-- name: message_promote_scheduled
UPDATE {schema}sqlbroker_message m SET state = 'available'
FROM (
    SELECT id FROM {schema}sqlbroker_message
    WHERE subscription = %(subscription)s AND state = 'scheduled'
      AND available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
    ORDER BY available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) due
WHERE m.id = due.id

-- name: message_claim
-- The claim_commit parameter is this transaction's synchronous_commit: 'off' unless the
-- backend keeps durable claims. A claim's commit then does not wait for the WAL flush: a
-- server crash can forget only the lease itself (the copy comes back available, its
-- attempt uncounted), and the ack's durable commit flushes the claim's record first.
WITH claim_ids AS MATERIALIZED (
    SELECT id FROM {schema}sqlbroker_message
    WHERE subscription = %(subscription)s
      AND state = 'available'
      AND available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND (expires_at IS NULL OR expires_at > coalesce(%(now)s::timestamptz, statement_timestamp()))
      -- A paused subscription claims nothing, and a flow-controlled one is claimed by
      -- message_claim_flow (flow.sql): uncorrelated, so one primary-key probe per claim
      -- (an InitPlan), not one per row.
      AND NOT EXISTS (SELECT 1 FROM {schema}sqlbroker_subscription s
                      WHERE s.name = %(subscription)s
                        AND (s.paused OR s.max_running IS NOT NULL OR s.key_concurrency IS NOT NULL
                             OR s.rate_count IS NOT NULL OR s.key_rate_count IS NOT NULL OR s.fair))
    ORDER BY priority, available_at, id
    -- The limit as a sub-select: its value is unknown to every plan, so that the generic
    -- plan costs what a custom one does and the prepared statement keeps it (a custom plan
    -- each time cost 0.15-0.2 ms of planning per claim, a third of the claim's server time).
    LIMIT (SELECT %(limit)s::integer)
    FOR UPDATE SKIP LOCKED
)
-- include: message_claim_lease

-- name: message_claim_lease
UPDATE {schema}sqlbroker_message m
-- The lease and attempt a claim gives each copy of its `claim_ids` (message_claim here,
-- message_claim_flow in flow.sql): one home for the rule on this dialect.
SET state = 'running',
    attempts = m.attempts + 1,
    lease_token = gen_random_uuid(),
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => %(lease)s),
    first_started_at = coalesce(m.first_started_at, coalesce(%(now)s::timestamptz, statement_timestamp())),
    worker = %(worker)s,
    max_attempts = coalesce(%(max_attempts)s::integer, m.max_attempts)
-- By primary key from the array of the ids (one InitPlan): whatever the row estimate of
-- `claim_ids`, every plan probes the key, where a join planned without the limit's value
-- hashes the whole table (5-10x slower). The setting is made once per statement.
WHERE m.id = ANY (ARRAY(SELECT id FROM claim_ids))
  AND (SELECT set_config('synchronous_commit', %(claim_commit)s, true)) IS NOT NULL
RETURNING m.id, m.message_id::text, m.subscription, m.topic, m.payload, m.content_type, m.headers,
          m.priority, m.ordering_key, m.idempotency_key, m.attempts, m.max_attempts,
          m.replay_count, m.enqueued_at, m.available_at, m.expires_at, m.lease_token::text,
          m.lease_expires_at

-- name: message_complete
-- Here and in the other statements that settle leases, the token alone proves the lease
-- (only a running copy has one). Testing state = 'running' as well would let the planner
-- pick the partial lease index and hash-join every running copy (0.42 ms instead of
-- 0.07 ms with 540 copies running); without it, each copy is one primary-key probe.
-- include: completed_archived
SELECT id, subscription, ordering_key, state FROM done ORDER BY id

-- name: message_complete_keyed
-- message_complete for copies that may have an ordering key: their keys' next copies are
-- promoted in the same statement (completed_promote). Not the plain one's statement: with
-- nothing to promote it cost 10-25% more server time.
-- include: completed_archived
-- include: completed_promote

-- name: completed_archived
-- (A fragment, the start of message_complete and message_complete_keyed.) The copies of
-- the valid leases leave the hot table (`done`) and are archived as completed.
-- An archive row or dead letter takes its subscription's tenant (one more primary-key probe
-- per copy): it stays that tenant's after the subscription is deleted and the name reused.
WITH l AS (SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::text[]) AS l(id, token)),
done AS (
    DELETE FROM {schema}sqlbroker_message m USING l
    WHERE m.id = l.id AND m.lease_token::text = l.token
    RETURNING m.*
),
archived AS (
    INSERT INTO {schema}sqlbroker_archive (
        delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
        idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
        enqueued_at, first_started_at, finished_at, tenant
    )
    SELECT id, message_id, subscription, topic, 'completed', priority, ordering_key,
           idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
           enqueued_at, first_started_at, coalesce(%(now)s::timestamptz, statement_timestamp()),
           (SELECT s.tenant FROM {schema}sqlbroker_subscription s WHERE s.name = done.subscription)
    FROM done
    ORDER BY id
)

-- name: message_complete_unarchived
-- message_complete for a backend with archive_completed=False: the copy is only deleted.
-- include: completed_deleted

-- name: message_complete_unarchived_keyed
-- message_complete_keyed for a backend with archive_completed=False.
WITH done AS (
-- include: completed_deleted
)
-- include: completed_promote

-- name: completed_deleted
-- (A fragment, in message_complete_unarchived and message_complete_unarchived_keyed.)
DELETE FROM {schema}sqlbroker_message m
USING unnest(%(ids)b::bigint[], %(tokens)b::text[]) AS l(id, token)
WHERE m.id = l.id AND m.lease_token::text = l.token
RETURNING m.id, m.subscription, m.ordering_key, m.state

-- name: completed_promote
-- (A fragment, the end of the message_complete_*keyed blocks, continuing their WITH after
-- its `done` of the copies completed.) The keys whose head completed get their next copy
-- in the same statement, not in a statement (and commit) of its own after each complete.
-- The rows `(id, subscription, ordering_key, state, promoted)` of the copies completed;
-- where `promoted` is false (no blocked copy in this statement's snapshot, another head,
-- or the next copy held), the plan promotes the key on its own (messages.py,
-- _promote_heads).
, vacated AS (SELECT DISTINCT subscription, ordering_key FROM done WHERE ordering_key IS NOT NULL),
leaving AS (SELECT id FROM done),
promoted AS (
    UPDATE {schema}sqlbroker_message m
-- include: key_head_state
    FROM (
        -- In id order, as key_promote's. A next copy another statement holds is skipped,
        -- not waited for: the complete never waits for it nor fails on its lock, and its
        -- key is promoted by key_promote after the commit, as it was before.
        SELECT l.id FROM {schema}sqlbroker_message l
        WHERE l.state = 'blocked' AND l.id IN (
-- include: key_next
        )
        ORDER BY l.id
        FOR UPDATE OF l SKIP LOCKED
    ) nxt
    WHERE m.id = nxt.id AND m.state = 'blocked'
    RETURNING m.subscription, m.ordering_key
)
SELECT d.id, d.subscription, d.ordering_key, d.state, p.ordering_key IS NOT NULL
FROM done d
LEFT JOIN promoted p ON p.subscription = d.subscription AND p.ordering_key = d.ordering_key
ORDER BY d.id

-- name: dead_insert
-- (A fragment, included by message_settle and lease_expired_dead: the dead-letter table's
-- columns, in the order their SELECTs give them.)
INSERT INTO {schema}sqlbroker_dead (
    delivery_id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
    payload, content_type, headers, attempts, max_attempts, replay_count, reason, error_type,
    error_message, traceback, enqueued_at, first_started_at, first_failed_at, last_failed_at,
    dead_at, tenant
)

-- name: message_settle
-- A mixed batch of settlements in one statement: kind 'complete' (archived when :archive,
-- its value stored as a result and announced on the result channel), 'dead' (to the dead
-- letters, announced on the dead channel), 'cancel' (archived as cancelled) leave the hot
-- table; 'retry' goes back to the queue (announced when available at once). Each copy at
-- most once. Rows: id, subscription, ordering_key, state, and whether the copy left the
-- table (its ordering key then promotes its next copy). Unused columns are NULL.
WITH l AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::text[], %(kinds)b::text[],
                         %(values)b::text[], %(afters)b::float8[], %(snoozes)b::boolean[],
                         %(errors)b::text[], %(reasons)b::text[], %(error_types)b::text[],
                         %(error_messages)b::text[], %(tracebacks)b::text[])
        AS l(id, token, kind, result_value, after_seconds, snooze, last_error, reason,
             error_type, error_message, traceback)
),
gone AS (
    DELETE FROM {schema}sqlbroker_message m USING l
    WHERE m.id = l.id AND m.lease_token::text = l.token AND l.kind <> 'retry'
    RETURNING m.*, l.kind, l.result_value, l.reason, l.error_type, l.error_message, l.traceback
),
archived AS (
    INSERT INTO {schema}sqlbroker_archive (
        delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
        idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
        enqueued_at, first_started_at, finished_at, tenant
    )
    SELECT id, message_id, subscription, topic,
           CASE WHEN kind = 'cancel' THEN 'cancelled' ELSE 'completed' END, priority,
           ordering_key, idempotency_key, payload, content_type, headers, attempts,
           max_attempts, replay_count, enqueued_at, first_started_at,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           (SELECT s.tenant FROM {schema}sqlbroker_subscription s WHERE s.name = gone.subscription)
    FROM gone
    WHERE kind = 'cancel' OR (kind = 'complete' AND %(archive)s)
    ORDER BY id
),
stored AS (
    INSERT INTO {schema}sqlbroker_result (
        delivery_id, message_id, subscription, value, finished_at, tenant
    )
    SELECT id, message_id, subscription, convert_to(result_value, 'UTF8'),
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           (SELECT s.tenant FROM {schema}sqlbroker_subscription s WHERE s.name = gone.subscription)
    FROM gone
    WHERE kind = 'complete' AND result_value IS NOT NULL
    ORDER BY id
    RETURNING message_id
),
dead AS (
-- include: dead_insert
    SELECT id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
           payload, content_type, headers, attempts, max_attempts, replay_count, reason,
           error_type, error_message, traceback, enqueued_at, first_started_at,
           coalesce(first_failed_at, coalesce(%(now)s::timestamptz, statement_timestamp())),
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           (SELECT s.tenant FROM {schema}sqlbroker_subscription s WHERE s.name = gone.subscription)
    FROM gone
    WHERE kind = 'dead'
    ORDER BY id
    RETURNING subscription
),
retried AS (
    UPDATE {schema}sqlbroker_message m
    SET state = CASE WHEN l.after_seconds > 0 THEN 'scheduled' ELSE 'available' END,
        available_at = coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => l.after_seconds),
        lease_token = NULL,
        lease_expires_at = NULL,
        worker = NULL,
        attempts = m.attempts - CASE WHEN l.snooze THEN 1 ELSE 0 END,
        last_error = coalesce(l.last_error, m.last_error),
        first_failed_at = CASE WHEN l.snooze THEN m.first_failed_at
            ELSE coalesce(m.first_failed_at, coalesce(%(now)s::timestamptz, statement_timestamp())) END,
        last_failed_at = CASE WHEN l.snooze THEN m.last_failed_at
            ELSE coalesce(%(now)s::timestamptz, statement_timestamp()) END
    FROM l
    WHERE m.id = l.id AND m.lease_token::text = l.token AND l.kind = 'retry'
    RETURNING m.id, m.subscription, m.state
),
notified AS (
    SELECT (SELECT count((SELECT pg_notify(%(result_channel)s, message_id::text))::text) FROM stored)
         + (SELECT count((SELECT pg_notify(%(dead_channel)s, subscription))::text) FROM dead)
         + (SELECT count((SELECT pg_notify(%(channel)s, subscription))::text)
            FROM retried WHERE state = 'available') AS n
)
SELECT id, subscription, ordering_key, state, true, (SELECT n FROM notified) FROM gone
UNION ALL
SELECT id, subscription, NULL, state, false, (SELECT n FROM notified) FROM retried
ORDER BY 1

-- name: message_extend
UPDATE {schema}sqlbroker_message m
SET lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => %(lease)s)
FROM unnest(%(ids)b::bigint[], %(tokens)b::text[]) AS l(id, token)
WHERE m.id = l.id AND m.lease_token::text = l.token
RETURNING m.id, m.lease_expires_at

-- name: message_release
UPDATE {schema}sqlbroker_message m
SET state = 'available',
    attempts = greatest(m.attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL
FROM unnest(%(ids)b::bigint[], %(tokens)b::text[]) AS l(id, token)
WHERE m.id = l.id AND m.lease_token::text = l.token
RETURNING m.id

-- name: lease_expired_dead
WITH spent AS (
    SELECT id FROM {schema}sqlbroker_message
    WHERE state = 'running'
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND attempts >= max_attempts
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}sqlbroker_message m USING spent WHERE m.id = spent.id RETURNING m.*
),
dead AS (
-- include: dead_insert
    SELECT id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
           payload, content_type, headers, attempts, max_attempts, replay_count,
           %(reason)s, %(error_type)s, %(error_message)s, NULL, enqueued_at,
           first_started_at,
           coalesce(first_failed_at, coalesce(%(now)s::timestamptz, statement_timestamp())),
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           (SELECT s.tenant FROM {schema}sqlbroker_subscription s WHERE s.name = gone.subscription)
    FROM gone
    ORDER BY id
    RETURNING subscription
),
notified AS (SELECT count((SELECT pg_notify(%(dead_channel)s, subscription))::text) AS n FROM dead)
SELECT g.id, g.subscription, g.ordering_key, g.state, (SELECT n FROM notified) FROM gone g

-- name: lease_expired_release
WITH expired AS (
    SELECT id FROM {schema}sqlbroker_message
    WHERE state = 'running'
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND attempts < max_attempts
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}sqlbroker_message m
SET state = 'available',
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL,
    last_error = %(last_error)s,
    first_failed_at = coalesce(m.first_failed_at, coalesce(%(now)s::timestamptz, statement_timestamp())),
    last_failed_at = coalesce(%(now)s::timestamptz, statement_timestamp())
FROM expired
WHERE m.id = expired.id

-- name: gone_archived
-- (A fragment, included by message_expire, message_cancel and lease_expired_cancelled.)
-- The copies a statement deleted (``gone``: the rows with an ``outcome``), archived under
-- their subscription's tenant.
archived AS (
    INSERT INTO {schema}sqlbroker_archive (
        delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
        idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
        enqueued_at, first_started_at, finished_at, tenant
    )
    SELECT id, message_id, subscription, topic, outcome, priority, ordering_key,
           idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
           enqueued_at, first_started_at, coalesce(%(now)s::timestamptz, statement_timestamp()),
           (SELECT s.tenant FROM {schema}sqlbroker_subscription s WHERE s.name = gone.subscription)
    FROM gone
    ORDER BY id
)

-- name: message_expire
WITH e AS (
    SELECT id FROM {schema}sqlbroker_message
    WHERE expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp()) AND state <> 'running'
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}sqlbroker_message m USING e WHERE m.id = e.id
    RETURNING m.*, 'expired'::text AS outcome
),
-- include: gone_archived
SELECT id, subscription, ordering_key, state FROM gone

-- name: message_cancel
WITH c AS (
    SELECT id FROM {schema}sqlbroker_message
    WHERE message_id = ANY (%(message_ids)b::uuid[]) AND state <> 'running'
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}sqlbroker_message m USING c WHERE m.id = c.id
    RETURNING m.*, 'cancelled'::text AS outcome
),
-- include: gone_archived
SELECT id, subscription, ordering_key, state FROM gone

-- name: key_lock
-- Publishers of one ordering key take turns, so that two copies of a key never both start
-- as its head. Sorted, so that two batches never wait on each other's keys.
SELECT pg_advisory_xact_lock(hashtextextended(k, 2305843009213693951))
FROM (SELECT DISTINCT unnest(%(keys)b::text[]) AS k ORDER BY 1) keys

-- name: key_try_lock
-- key_lock without waiting: the keys whose lock another transaction holds now. Run alone
-- (autocommit) the locks taken are released at once: a barrier behind the key's publishers.
SELECT k
FROM (SELECT DISTINCT unnest(%(keys)b::text[]) AS k ORDER BY 1) keys
WHERE NOT pg_try_advisory_xact_lock(hashtextextended(k, 2305843009213693951))

-- name: pause
SELECT pg_sleep(%(seconds)s::float8)

-- name: key_promote
-- After a key's head left, its oldest blocked copy becomes the head (unless a head exists).
WITH vacated AS (
    SELECT DISTINCT subscription, ordering_key
    FROM unnest(%(subscriptions)b::text[], %(keys)b::text[]) AS k(subscription, ordering_key)
),
leaving AS (SELECT NULL::bigint AS id WHERE false)  -- the heads left in statements before
UPDATE {schema}sqlbroker_message m
-- include: key_head_state
FROM (
    -- The copies are locked in id order, as key_repair's are: two statements promoting
    -- overlapping keys (a worker's and the reaper's) then never wait for each other in a
    -- cycle (the keys came in hash order, and such a pair was a deadlock).
    SELECT l.id FROM {schema}sqlbroker_message l
    WHERE l.state = 'blocked' AND l.id IN (
-- include: key_next
    )
    ORDER BY l.id
    FOR UPDATE OF l
) nxt
-- The state again on the row itself: a concurrent statement may have promoted and claimed
-- the copy since this statement's snapshot, and only this condition is checked again.
WHERE m.id = nxt.id AND m.state = 'blocked'
RETURNING m.subscription, m.ordering_key

-- name: key_next
-- (A fragment, in key_promote and completed_promote.) The next copy of each key of
-- `vacated(subscription, ordering_key)` (distinct) whose only heads, if any, are copies of
-- `leaving(id)` (removed by the same statement, still in its snapshot): its oldest blocked
-- copy. Per key: no head (one probe of the key-head index), then the oldest blocked copy.
SELECT b.id
FROM vacated k
CROSS JOIN LATERAL (
    SELECT b.id FROM {schema}sqlbroker_message b
    WHERE b.subscription = k.subscription AND b.ordering_key = k.ordering_key
      AND b.state = 'blocked'
    ORDER BY b.id
    LIMIT 1
) b
WHERE NOT EXISTS (
    SELECT 1 FROM {schema}sqlbroker_message o
    WHERE o.subscription = k.subscription AND o.ordering_key = k.ordering_key
      AND o.ordering_key IS NOT NULL AND o.state <> 'blocked'
      AND NOT EXISTS (SELECT 1 FROM leaving g WHERE g.id = o.id)
)

-- name: key_head_state
-- (A fragment.) A copy that becomes its key's head is available, or scheduled until due.
SET state = CASE WHEN m.available_at > coalesce(%(now)s::timestamptz, statement_timestamp())
                 THEN 'scheduled' ELSE 'available' END

-- name: key_repair
-- Keys left with blocked copies and no head (a crash between a head's removal and the
-- promotion, or a publish racing it) get their oldest blocked copy promoted.
UPDATE {schema}sqlbroker_message m
-- include: key_head_state
FROM (
    -- Locked in id order (as key_promote's), skipping a copy another statement is
    -- promoting right now: the safety net never waits for the promotion it backs up.
    SELECT l.id FROM {schema}sqlbroker_message l
    WHERE l.state = 'blocked' AND l.id IN (
        SELECT DISTINCT ON (b.subscription, b.ordering_key) b.id
        FROM {schema}sqlbroker_message b
        WHERE b.state = 'blocked'
          AND NOT EXISTS (
              SELECT 1 FROM {schema}sqlbroker_message o
              WHERE o.subscription = b.subscription AND o.ordering_key = b.ordering_key
                AND o.ordering_key IS NOT NULL AND o.state <> 'blocked'
          )
        ORDER BY b.subscription, b.ordering_key, b.id
        LIMIT %(limit)s
    )
    ORDER BY l.id
    FOR UPDATE OF l SKIP LOCKED
) nxt
-- As in key_promote: never reopen a copy promoted and claimed since the snapshot.
WHERE m.id = nxt.id AND m.state = 'blocked'



-- name: untimed
-- The first statement of a transaction whose statements are the caller's (a handler's
-- msg.transaction()) or long by nature (a migration, the Spark export's bulk writes):
-- the sessions' lock_timeout and statement_timeout, meant for sqlbroker's own short
-- statements, do not apply to it. Transaction-local, so right behind a transaction pooler
-- too, where the timeouts come from the role's settings.
SELECT set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true)

-- name: dedupe_reserve_one
-- dedupe_reserve for one key, with scalar parameters (publishing: one row, one statement).
INSERT INTO {schema}sqlbroker_dedupe AS d (topic, idempotency_key, message_id, payload_hash, created_at, expires_at)
SELECT %(topic)s, %(idempotency_key)s, %(message_id)s::uuid, %(payload_hash)s, t.now,
       t.now + make_interval(secs => %(window)s::float8)
FROM (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now) t
ON CONFLICT (topic, idempotency_key, tenant) DO UPDATE
    SET message_id = excluded.message_id,
        payload_hash = excluded.payload_hash,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE d.expires_at <= excluded.created_at
RETURNING topic, idempotency_key

-- name: dedupe_get_one
SELECT topic, idempotency_key, message_id::text, payload_hash
FROM {schema}sqlbroker_dedupe
WHERE topic = %(topic)s AND idempotency_key = %(idempotency_key)s

-- name: queue_create
-- The subscription of a queue, unless it exists; a row: it was created (its pattern next).
INSERT INTO {schema}sqlbroker_subscription (name, created_at)
VALUES (%(name)s, coalesce(%(now)s::timestamptz, statement_timestamp()))
ON CONFLICT (name) DO NOTHING
RETURNING name

-- name: queue_on_first_use
-- (A fragment of the inserts above, after their CTE `t` with the statement's `now`.) The
-- queue named :subscription, when there is one, is created in the publish's own statement
-- if it does not exist yet, with its name as its one pattern. The NOT EXISTS spares an
-- existing queue the insert attempt: that evaluates the table's CHECK constraints (each
-- one's expression built anew per statement) before ON CONFLICT finds the row, two fifths
-- of a single send's server time; the ON CONFLICT still settles a concurrent creation.
queue AS (
    INSERT INTO {schema}sqlbroker_subscription (name, created_at)
    SELECT %(subscription)s::text, t.now FROM t
    WHERE %(subscription)s::text IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {schema}sqlbroker_subscription s
                      WHERE s.name = %(subscription)s::text)
    ON CONFLICT (name) DO NOTHING
    RETURNING name
),
queue_pattern AS (
    INSERT INTO {schema}sqlbroker_subscription_pattern (subscription, pattern, regex)
    SELECT name, name, %(queue_regex)s FROM queue
),
