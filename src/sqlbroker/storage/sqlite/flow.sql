-- Concurrency caps, rate limits and fairness (storage/operations/flow.py,
-- docs/flow-control.md). A subscription with any of them set is claimed by
-- message_claim_flow only (message_claim claims nothing from it).

-- name: flow_set
UPDATE sqlbroker_subscription
SET max_running = :max_running, key_concurrency = :key_concurrency,
    rate_count = :rate_count, rate_period = :rate_period,
    key_rate_count = :key_rate_count, key_rate_period = :key_rate_period,
    fair = :fair
WHERE name = :name
RETURNING name

-- name: flow_list
-- Each subscription's flow settings, its running copies and how long its rate limit holds
-- claims back from now (the bucket's next claim is due later than now).
SELECT s.name, s.max_running, s.key_concurrency, s.rate_count, s.rate_period,
       s.key_rate_count, s.key_rate_period, s.fair,
       (SELECT count(*) FROM sqlbroker_message m
        WHERE m.subscription = s.name AND m.state = 'running'),
       (SELECT max(0.0, b.tat - :now
                        - (max(1, CAST(s.rate_count / s.rate_period AS INTEGER)) - 1)
                          * s.rate_period / s.rate_count)
        FROM sqlbroker_flow_bucket b
        WHERE b.subscription = s.name AND b.ordering_key = '')
FROM sqlbroker_subscription s
WHERE (:name IS NULL OR s.name = :name)
ORDER BY s.name

-- name: flow_controlled
-- Whether the subscription's claims go through message_claim_flow.
SELECT 1 FROM sqlbroker_subscription s
WHERE s.name = :subscription AND NOT s.paused
  AND (s.max_running IS NOT NULL OR s.key_concurrency IS NOT NULL OR s.rate_count IS NOT NULL
       OR s.key_rate_count IS NOT NULL OR s.fair)

-- name: message_claim_flow
-- message_claim for a flow-controlled subscription (see the PostgreSQL block for the
-- rules). BEGIN IMMEDIATE serializes SQLite's writers, so the running copies and rate
-- buckets read here are current. The picked copies go through a temporary table: the
-- buckets are charged for them before they are claimed, by the last statement, whose rows
-- are the claim's.
CREATE TEMP TABLE IF NOT EXISTS sqlbroker_flow_pick (
    id           INTEGER PRIMARY KEY,
    ordering_key TEXT
);
DELETE FROM temp.sqlbroker_flow_pick;
INSERT INTO temp.sqlbroker_flow_pick (id, ordering_key)
WITH f AS (
    SELECT s.max_running, s.key_concurrency, s.key_rate_count, s.fair,
           s.rate_period / s.rate_count AS spacing,
           max(1, CAST(s.rate_count / s.rate_period AS INTEGER)) AS burst,
           s.key_rate_period / s.key_rate_count AS key_spacing,
           max(1, CAST(s.key_rate_count / s.key_rate_period AS INTEGER)) AS key_burst
    FROM sqlbroker_subscription s
    WHERE s.name = :subscription AND NOT s.paused
      AND (s.max_running IS NOT NULL OR s.key_concurrency IS NOT NULL OR s.rate_count IS NOT NULL
           OR s.key_rate_count IS NOT NULL OR s.fair)
),
st AS (
    SELECT k.ordering_key, k.running, k.tat,
           min(coalesce(f.key_concurrency - k.running, 1 << 62),
               coalesce(CAST(floor(f.key_burst - (max(coalesce(k.tat, :now), :now) - :now)
                                   / f.key_spacing + 1e-9) AS INTEGER), 1 << 62)) AS key_room
    FROM f, (
        SELECT u.ordering_key, sum(u.running) AS running, max(u.tat) AS tat
        FROM (
            SELECT m.ordering_key, 1 AS running, NULL AS tat
            FROM sqlbroker_message m
            WHERE m.subscription = :subscription AND m.state = 'running'
            UNION ALL
            SELECT b.ordering_key, 0, b.tat
            FROM sqlbroker_flow_bucket b
            WHERE b.subscription = :subscription
        ) u
        GROUP BY u.ordering_key
    ) k
),
room AS (
    SELECT max(0, min(
        :limit,
        coalesce(f.max_running - (SELECT coalesce(sum(st.running), 0) FROM st), :limit),
        coalesce(CAST(floor(f.burst - (max(coalesce(
            (SELECT st.tat FROM st WHERE st.ordering_key = ''), :now), :now) - :now) / f.spacing
            + 1e-9) AS INTEGER), :limit)
    )) AS n
    FROM f
),
plain AS (
    SELECT * FROM (
        SELECT m.id, m.ordering_key, m.priority, m.available_at, 1 AS rank
        FROM sqlbroker_message m
        WHERE m.subscription = :subscription
          AND m.state = 'available'
          AND m.available_at <= :now
          AND (m.expires_at IS NULL OR m.expires_at > :now)
        ORDER BY m.priority, m.available_at, m.id
        -- The walks' switches are their limits: a branch switched off (or a paused
        -- subscription, no row in f) reads no row.
        LIMIT coalesce((SELECT CASE WHEN f.key_concurrency IS NULL AND f.key_rate_count IS NULL
                                         AND NOT f.fair THEN :limit ELSE 0 END FROM f), 0)
    )
),
-- With key rules or fairness, the walks of the PostgreSQL block: the keys at their cap are
-- skipped, the first `limit` available copies and the first `limit` keyed ones are met.
full_keys AS (
    SELECT st.ordering_key FROM st
    WHERE st.ordering_key IS NOT NULL AND st.ordering_key <> '' AND st.key_room <= 0
),
walked AS (
    SELECT * FROM (
        SELECT m.id, m.ordering_key, m.priority, m.available_at
        FROM sqlbroker_message m
        WHERE m.subscription = :subscription
          AND m.state = 'available'
          AND m.available_at <= :now
          AND (m.expires_at IS NULL OR m.expires_at > :now)
          AND (m.ordering_key IS NULL OR m.ordering_key NOT IN (SELECT k.ordering_key FROM full_keys k))
        ORDER BY m.priority, m.available_at, m.id
        LIMIT coalesce((SELECT CASE WHEN f.key_concurrency IS NOT NULL OR f.key_rate_count IS NOT NULL
                                         OR f.fair THEN :limit ELSE 0 END FROM f), 0)
    )
    UNION ALL
    SELECT * FROM (
        SELECT m.id, m.ordering_key, m.priority, m.available_at
        FROM sqlbroker_message m INDEXED BY sqlbroker_message_key_claim
        WHERE m.subscription = :subscription
          AND m.state = 'available'
          AND m.ordering_key IS NOT NULL
          AND m.available_at <= :now
          AND (m.expires_at IS NULL OR m.expires_at > :now)
          AND m.ordering_key NOT IN (SELECT k.ordering_key FROM full_keys k)
        ORDER BY m.priority, m.available_at, m.id
        LIMIT coalesce((SELECT CASE WHEN f.key_concurrency IS NOT NULL OR f.key_rate_count IS NOT NULL
                                         OR f.fair THEN :limit ELSE 0 END FROM f), 0)
    )
),
touched AS (
    SELECT w.ordering_key FROM walked w WHERE w.ordering_key IS NOT NULL
    UNION
    SELECT st.ordering_key FROM st, f
    WHERE f.key_concurrency IS NOT NULL AND st.running > 0 AND st.ordering_key IS NOT NULL
      AND st.ordering_key <> '' AND st.key_room > 0
),
waiting AS (
    SELECT w.id, w.ordering_key, w.priority, w.available_at
    FROM walked w WHERE w.ordering_key IS NULL
    UNION ALL
    SELECT m.id, m.ordering_key, m.priority, m.available_at
    FROM touched t JOIN sqlbroker_message m ON m.id IN (
        SELECT a.id FROM sqlbroker_message a INDEXED BY sqlbroker_message_key_head
        WHERE a.subscription = :subscription
          AND a.ordering_key = t.ordering_key
          AND a.ordering_key IS NOT NULL AND a.state <> 'blocked'
          AND a.state = 'available'
          AND a.available_at <= :now
          AND (a.expires_at IS NULL OR a.expires_at > :now))
    UNION ALL
    SELECT m.id, m.ordering_key, m.priority, m.available_at
    FROM f CROSS JOIN touched t JOIN sqlbroker_message m ON f.key_concurrency IS NOT NULL AND m.id IN (
        SELECT b.id FROM sqlbroker_message b
        WHERE b.subscription = :subscription
          AND b.ordering_key = t.ordering_key
          AND b.state = 'blocked'
          AND b.available_at <= :now
          AND (b.expires_at IS NULL OR b.expires_at > :now)
        ORDER BY b.ordering_key, b.id
        LIMIT :limit)
),
ranked AS (
    SELECT w.id, w.ordering_key, w.priority, w.available_at,
           row_number() OVER (PARTITION BY w.ordering_key
                              ORDER BY w.priority, w.available_at, w.id) AS rank
    FROM waiting w
)
SELECT c.id, c.ordering_key
FROM (SELECT * FROM plain UNION ALL SELECT * FROM ranked) c
CROSS JOIN f
LEFT JOIN st ON st.ordering_key = c.ordering_key
WHERE c.ordering_key IS NULL
   OR c.rank <= CASE WHEN st.ordering_key IS NULL
                     THEN min(coalesce(f.key_concurrency, c.rank), coalesce(f.key_burst, c.rank))
                     ELSE st.key_room END
ORDER BY CASE WHEN f.fair THEN c.rank END, c.priority, c.available_at, c.id
LIMIT coalesce((SELECT n FROM room), 0);
-- The rate buckets are charged: each claimed key, and the subscription ('').
INSERT INTO sqlbroker_flow_bucket (subscription, ordering_key, tat)
SELECT :subscription, ch.ordering_key,
       max(coalesce(b.tat, :now), :now) + ch.claims * ch.spacing
FROM (
    SELECT p.ordering_key, count(*) AS claims, s.key_rate_period / s.key_rate_count AS spacing
    FROM temp.sqlbroker_flow_pick p JOIN sqlbroker_subscription s ON s.name = :subscription
    WHERE p.ordering_key IS NOT NULL AND s.key_rate_count IS NOT NULL
    GROUP BY p.ordering_key
    UNION ALL
    SELECT '', count(*), s.rate_period / s.rate_count
    FROM temp.sqlbroker_flow_pick p JOIN sqlbroker_subscription s ON s.name = :subscription
    WHERE s.rate_count IS NOT NULL
    GROUP BY s.name
) ch
LEFT JOIN sqlbroker_flow_bucket b
    ON b.subscription = :subscription AND b.ordering_key = ch.ordering_key
WHERE true
ON CONFLICT (subscription, ordering_key) DO UPDATE SET tat = excluded.tat;
-- A bucket whose time has passed means the same as none.
DELETE FROM sqlbroker_flow_bucket
WHERE subscription = :subscription AND tat <= :now
  AND ordering_key NOT IN (SELECT coalesce(p.ordering_key, '') FROM temp.sqlbroker_flow_pick p)
  AND NOT (ordering_key = '' AND EXISTS (SELECT 1 FROM temp.sqlbroker_flow_pick));
WITH claim_ids AS (SELECT id FROM temp.sqlbroker_flow_pick)
-- include: message_claim_lease

-- name: flow_wait
-- After a flow claim took fewer than it asked for: seconds until the subscription's rate
-- limit lets the next claim through, and the least such wait of its throttled keys (NULL:
-- none waits). The worker sleeps that long instead of polling.
SELECT (SELECT b.tat - :now
               - (max(1, CAST(s.rate_count / s.rate_period AS INTEGER)) - 1)
                 * s.rate_period / s.rate_count
        FROM sqlbroker_flow_bucket b
        WHERE b.subscription = s.name AND b.ordering_key = ''),
       (SELECT min(b.tat) - :now
               - (max(1, CAST(s.key_rate_count / s.key_rate_period AS INTEGER)) - 1)
                 * s.key_rate_period / s.key_rate_count
        FROM sqlbroker_flow_bucket b
        WHERE b.subscription = s.name AND b.ordering_key <> '')
FROM sqlbroker_subscription s
WHERE s.name = :subscription
