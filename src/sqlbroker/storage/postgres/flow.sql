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
-- include: flow_limited

-- name: flow_limited
-- (A fragment: the subscription s is %(subscription)s, not paused, with a flow limit.)
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
--
-- A claim costs its batch and the keys it touches, not the backlog (issue 26): instead of
-- ranking every waiting copy, it walks the available copies in claim order, the first
-- `limit` of them and the first `limit` with a key (schema 17's index), skipping the keys
-- already at their cap; the keys met there, and with key_concurrency the keys running
-- copies, are the keys it touches. Each touched key gives its available copies (the
-- key-head index: a key has few, its head and copies back from a retry) and its first
-- `limit` blocked ones in publish order (the key index); only those are ranked. A key
-- whose copies are all blocked behind a delayed head is met again when its head is due.
WITH f AS MATERIALIZED (
    SELECT s.max_running, s.key_concurrency, s.key_rate_count, s.fair,
           s.rate_period / s.rate_count AS spacing,
           greatest(1, floor(s.rate_count / s.rate_period)) AS burst,
           s.key_rate_period / s.key_rate_count AS key_spacing,
           greatest(1, floor(s.key_rate_count / s.key_rate_period)) AS key_burst,
           coalesce(%(now)s::timestamptz, statement_timestamp()) AS now
    FROM {schema}sqlbroker_subscription s
-- include: flow_limited
),
st AS MATERIALIZED (
    SELECT st.ordering_key, st.running, st.tat,
           least(f.key_concurrency - st.running,
                 floor(f.key_burst - extract(epoch FROM greatest(st.tat, f.now) - f.now)
                                     / f.key_spacing + 1e-9)) AS key_room
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
-- include: flow_copy_due
      AND (SELECT f.key_concurrency IS NULL AND f.key_rate_count IS NULL AND NOT f.fair FROM f)
    ORDER BY m.priority, m.available_at, m.id
    LIMIT %(limit)s
),
-- With key rules or fairness: the keys at their cap (running or rate), which the walks skip.
full_keys AS MATERIALIZED (
    SELECT st.ordering_key FROM st
    WHERE st.ordering_key IS NOT NULL AND st.ordering_key <> '' AND st.key_room <= 0
),
walked AS MATERIALIZED (
    (SELECT m.id, m.ordering_key, m.priority, m.available_at
     FROM {schema}sqlbroker_message m
     WHERE m.subscription = %(subscription)s
       AND m.state = 'available'
-- include: flow_copy_due
       AND (m.ordering_key IS NULL OR m.ordering_key NOT IN (SELECT k.ordering_key FROM full_keys k))
       AND (SELECT f.key_concurrency IS NOT NULL OR f.key_rate_count IS NOT NULL OR f.fair FROM f)
     ORDER BY m.priority, m.available_at, m.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT m.id, m.ordering_key, m.priority, m.available_at
     FROM {schema}sqlbroker_message m
     WHERE m.subscription = %(subscription)s
       AND m.state = 'available'
       AND m.ordering_key IS NOT NULL
-- include: flow_copy_due
       AND m.ordering_key NOT IN (SELECT k.ordering_key FROM full_keys k)
       AND (SELECT f.key_concurrency IS NOT NULL OR f.key_rate_count IS NOT NULL OR f.fair FROM f)
     ORDER BY m.priority, m.available_at, m.id
     LIMIT %(limit)s)
),
touched AS (
    SELECT w.ordering_key FROM walked w WHERE w.ordering_key IS NOT NULL
    UNION
    SELECT st.ordering_key FROM st CROSS JOIN f
    WHERE f.key_concurrency IS NOT NULL AND st.running > 0 AND st.ordering_key IS NOT NULL
      AND st.ordering_key <> '' AND NOT st.key_room <= 0
),
waiting AS (
    SELECT w.id, w.ordering_key, w.priority, w.available_at
    FROM walked w WHERE w.ordering_key IS NULL
    UNION ALL
    SELECT c.id, c.ordering_key, c.priority, c.available_at
    FROM touched t CROSS JOIN LATERAL (
        (SELECT m.id, m.ordering_key, m.priority, m.available_at
         FROM {schema}sqlbroker_message m
         WHERE m.subscription = %(subscription)s
           AND m.ordering_key = t.ordering_key
           -- 'available' said as the key-head index's condition and what the state's
           -- CHECK leaves, so that the planner probes that index (not schema 17's).
           AND m.state <> 'blocked' AND m.state <> 'running' AND m.state <> 'scheduled'
           AND m.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
           AND (m.expires_at IS NULL OR m.expires_at > coalesce(%(now)s::timestamptz, statement_timestamp())))
        UNION ALL
        (SELECT m.id, m.ordering_key, m.priority, m.available_at
         FROM {schema}sqlbroker_message m
         WHERE m.subscription = %(subscription)s
           AND m.ordering_key = t.ordering_key
           AND m.state = 'blocked'
-- include: flow_copy_due
           AND (SELECT f.key_concurrency IS NOT NULL FROM f)
         ORDER BY m.ordering_key, m.id
         LIMIT %(limit)s)
    ) c
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
    WHERE c.ordering_key IS NULL
       OR c.rank <= coalesce(CASE WHEN st.ordering_key IS NULL
                                  THEN least(f.key_concurrency,
                                             CASE WHEN f.key_spacing IS NOT NULL THEN f.key_burst END)
                                  ELSE st.key_room END,
                             c.rank)
    ORDER BY CASE WHEN f.fair THEN c.rank END, c.priority, c.available_at, c.id
    LIMIT (SELECT n FROM room)
),
claim_ids AS (
    SELECT m.id FROM {schema}sqlbroker_message m
    WHERE m.id = ANY (ARRAY(SELECT id FROM picked)) AND m.state IN ('available', 'blocked')
    FOR UPDATE OF m SKIP LOCKED
),
claimed AS (
-- include: message_claim_lease
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

-- name: flow_copy_due
-- (A fragment of message_claim_flow: the copy m is due and has not expired.)
AND m.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
AND (m.expires_at IS NULL OR m.expires_at > coalesce(%(now)s::timestamptz, statement_timestamp()))
