-- Concurrency caps, rate limits and fairness (storage/operations/flow.py,
-- docs/flow-control.md). A subscription with any of them set is claimed by
-- message_claim_flow only (message_claim claims nothing from it).

-- name: flow_set
UPDATE {schema}sqlbroker_subscription
SET max_running = %(max_running)s, key_concurrency = %(key_concurrency)s,
    rate_count = %(rate_count)s, rate_period = %(rate_period)s,
    key_rate_count = %(key_rate_count)s, key_rate_period = %(key_rate_period)s,
    fair = %(fair)s
WHERE name = %(name)s
RETURNING name

-- name: flow_list
-- Each subscription's flow settings, its running copies and whether its rate limit is
-- holding claims back now (the bucket's next claim is due later than now).
SELECT s.name, s.max_running, s.key_concurrency, s.rate_count, s.rate_period,
       s.key_rate_count, s.key_rate_period, s.fair,
       (SELECT count(*) FROM {schema}sqlbroker_message m
        WHERE m.subscription = s.name AND m.state = 'running'),
       (SELECT greatest(0, extract(epoch FROM b.tat - coalesce(%(now)s::timestamptz, statement_timestamp()))
                           - (greatest(1, floor(s.rate_count / s.rate_period)) - 1)
                             * s.rate_period / s.rate_count)::float8
        FROM {schema}sqlbroker_flow_bucket b
        WHERE b.subscription = s.name AND b.ordering_key = '')
FROM {schema}sqlbroker_subscription s
WHERE (%(name)s::text IS NULL OR s.name = %(name)s::text)
ORDER BY s.name

-- name: flow_controlled
-- Whether the subscription's claims go through message_claim_flow.
SELECT 1 FROM {schema}sqlbroker_subscription s
WHERE s.name = %(subscription)s AND NOT s.paused
  AND (s.max_running IS NOT NULL OR s.key_concurrency IS NOT NULL OR s.rate_count IS NOT NULL
       OR s.key_rate_count IS NOT NULL OR s.fair)

-- name: message_claim_flow
-- message_claim for a flow-controlled subscription. sqlbroker_flow_state (schema 15) takes
-- the subscription's claim lock and reads its running copies and rate buckets afresh, so
-- the room computed here is never stale: at most max_running - running copies in all, at
-- most key_concurrency - running per ordering key, at most as many as the rate buckets
-- (GCRA: one claim per `spacing` seconds, up to `burst` at once) allow. Candidates are
-- ranked within their ordering key (copies without one are one group); fair orders by
-- that rank first, which takes the keys in turn. With key_concurrency set, the blocked
-- copies of a key are claimable too (a key runs up to that many at once, so its order is
-- no longer strict). Rows are claimed with SKIP LOCKED; one that changed since this
-- statement's snapshot is checked again and skipped, so a claim can only take fewer.
WITH f AS MATERIALIZED (
    SELECT s.max_running, s.key_concurrency, s.key_rate_count, s.fair,
           s.rate_period / s.rate_count AS spacing,
           greatest(1, floor(s.rate_count / s.rate_period)) AS burst,
           s.key_rate_period / s.key_rate_count AS key_spacing,
           greatest(1, floor(s.key_rate_count / s.key_rate_period)) AS key_burst,
           coalesce(%(now)s::timestamptz, statement_timestamp()) AS now
    FROM {schema}sqlbroker_subscription s
    WHERE s.name = %(subscription)s AND NOT s.paused
      AND (s.max_running IS NOT NULL OR s.key_concurrency IS NOT NULL OR s.rate_count IS NOT NULL
           OR s.key_rate_count IS NOT NULL OR s.fair)
),
st AS MATERIALIZED (
    SELECT st.ordering_key, st.running, st.tat
    FROM f CROSS JOIN LATERAL {schema}sqlbroker_flow_state(%(subscription)s) st
),
room AS MATERIALIZED (
    SELECT greatest(0, least(
        %(limit)s,
        f.max_running - (SELECT coalesce(sum(st.running), 0) FROM st),
        floor(f.burst - extract(epoch FROM greatest(
            (SELECT st.tat FROM st WHERE st.ordering_key = ''), f.now) - f.now) / f.spacing + 1e-9)
    ))::integer AS n
    FROM f
),
-- Without key rules or fairness, the most urgent copies, as message_claim takes them.
plain AS (
    SELECT m.id, m.ordering_key, m.priority, m.available_at, 1::bigint AS rank
    FROM {schema}sqlbroker_message m
    WHERE m.subscription = %(subscription)s
      AND m.state = 'available'
      AND m.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND (m.expires_at IS NULL OR m.expires_at > coalesce(%(now)s::timestamptz, statement_timestamp()))
      AND (SELECT f.key_concurrency IS NULL AND f.key_rate_count IS NULL AND NOT f.fair FROM f)
    ORDER BY m.priority, m.available_at, m.id
    LIMIT %(limit)s
),
-- With key rules or fairness: every claimable copy, ranked within its key. The available
-- ones come by the claim index, the blocked ones (with key_concurrency) by the key index.
waiting AS (
    SELECT m.id, m.ordering_key, m.priority, m.available_at
    FROM {schema}sqlbroker_message m
    WHERE m.subscription = %(subscription)s
      AND m.state = 'available'
      AND m.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND (m.expires_at IS NULL OR m.expires_at > coalesce(%(now)s::timestamptz, statement_timestamp()))
      AND (SELECT f.key_concurrency IS NOT NULL OR f.key_rate_count IS NOT NULL OR f.fair FROM f)
    UNION ALL
    SELECT m.id, m.ordering_key, m.priority, m.available_at
    FROM {schema}sqlbroker_message m
    WHERE m.subscription = %(subscription)s
      AND m.ordering_key IS NOT NULL
      AND m.state = 'blocked'
      AND m.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND (m.expires_at IS NULL OR m.expires_at > coalesce(%(now)s::timestamptz, statement_timestamp()))
      AND (SELECT f.key_concurrency IS NOT NULL FROM f)
),
ranked AS (
    SELECT w.id, w.ordering_key, w.priority, w.available_at,
           row_number() OVER (PARTITION BY w.ordering_key
                              ORDER BY w.priority, w.available_at, w.id) AS rank
    FROM waiting w
),
picked AS (
    SELECT c.id
    FROM (SELECT * FROM plain UNION ALL SELECT * FROM ranked) c
    CROSS JOIN f
    LEFT JOIN st ON st.ordering_key = c.ordering_key
    WHERE c.ordering_key IS NULL OR c.rank <= coalesce(least(
        f.key_concurrency - coalesce(st.running, 0),
        floor(f.key_burst - extract(epoch FROM greatest(st.tat, f.now) - f.now) / f.key_spacing
              + 1e-9)
    ), c.rank)
    ORDER BY CASE WHEN f.fair THEN c.rank END, c.priority, c.available_at, c.id
    LIMIT (SELECT n FROM room)
),
locked AS (
    SELECT m.id FROM {schema}sqlbroker_message m
    WHERE m.id IN (SELECT id FROM picked) AND m.state IN ('available', 'blocked')
    FOR UPDATE OF m SKIP LOCKED
),
claimed AS (
    UPDATE {schema}sqlbroker_message m
    SET state = 'running',
        attempts = m.attempts + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => %(lease)s),
        first_started_at = coalesce(m.first_started_at, coalesce(%(now)s::timestamptz, statement_timestamp())),
        worker = %(worker)s,
        max_attempts = coalesce(%(max_attempts)s::integer, m.max_attempts)
    FROM locked
    WHERE m.id = locked.id AND set_config('synchronous_commit', %(claim_commit)s, true) IS NOT NULL
    RETURNING m.id, m.message_id::text, m.subscription, m.topic, m.payload, m.content_type, m.headers,
              m.priority, m.ordering_key, m.idempotency_key, m.attempts, m.max_attempts,
              m.replay_count, m.enqueued_at, m.available_at, m.expires_at, m.lease_token::text,
              m.lease_expires_at
),
-- What the rate buckets are charged: each claimed key, and the subscription ('').
charges AS (
    SELECT c.ordering_key, count(*) AS claims, f.key_spacing AS spacing
    FROM claimed c CROSS JOIN f
    WHERE c.ordering_key IS NOT NULL AND f.key_rate_count IS NOT NULL
    GROUP BY c.ordering_key, f.key_spacing
    UNION ALL
    SELECT '', count(*), f.spacing
    FROM claimed c CROSS JOIN f
    WHERE f.spacing IS NOT NULL
    GROUP BY f.spacing
),
charged AS (
    INSERT INTO {schema}sqlbroker_flow_bucket (subscription, ordering_key, tat)
    SELECT %(subscription)s, ch.ordering_key,
           greatest(st.tat, f.now) + make_interval(secs => ch.claims * ch.spacing)
    FROM charges ch CROSS JOIN f LEFT JOIN st ON st.ordering_key = ch.ordering_key
    ON CONFLICT (subscription, ordering_key) DO UPDATE SET tat = excluded.tat
),
-- A bucket whose time has passed means the same as none.
swept AS (
    DELETE FROM {schema}sqlbroker_flow_bucket b
    WHERE b.subscription = %(subscription)s AND b.tat <= (SELECT f.now FROM f)
      AND b.ordering_key NOT IN (SELECT ch.ordering_key FROM charges ch)
)
SELECT * FROM claimed

-- name: flow_wait
-- After a flow claim took fewer than it asked for: seconds until the subscription's rate
-- limit lets the next claim through, and the least such wait of its throttled keys (NULL:
-- none waits). The worker sleeps that long instead of polling.
SELECT (SELECT extract(epoch FROM b.tat - coalesce(%(now)s::timestamptz, statement_timestamp()))::float8
               - (greatest(1, floor(s.rate_count / s.rate_period)) - 1) * s.rate_period / s.rate_count
        FROM {schema}sqlbroker_flow_bucket b
        WHERE b.subscription = s.name AND b.ordering_key = ''),
       (SELECT min(extract(epoch FROM b.tat - coalesce(%(now)s::timestamptz, statement_timestamp()))::float8)
               - (greatest(1, floor(s.key_rate_count / s.key_rate_period)) - 1)
                 * s.key_rate_period / s.key_rate_count
        FROM {schema}sqlbroker_flow_bucket b
        WHERE b.subscription = s.name AND b.ordering_key <> '')
FROM {schema}sqlbroker_subscription s
WHERE s.name = %(subscription)s
