-- Retention (PostgreSQL): per-subscription times, the partition days of the archive, and
-- the bounded deletes of rows past their time. Times are seconds; `now` is the test clock
-- or NULL (the database clock).

-- name: retention_set
UPDATE {schema}sqlbroker_subscription
SET archive_retention = CASE WHEN %(change_archive)s THEN %(archive)s::float8 ELSE archive_retention END,
    dead_retention = CASE WHEN %(change_dead)s THEN %(dead)s::float8 ELSE dead_retention END
WHERE name = %(name)s

-- name: retention_list
SELECT name, archive_retention, dead_retention
FROM {schema}sqlbroker_subscription
WHERE %(name)s::text IS NULL OR name = %(name)s
ORDER BY name

-- name: archive_partitions_maintain
-- Days are dropped once every row in them is past the longest archive retention in force
-- (`keep`); shorter ones are applied by archive_trim_shorter.
SELECT {schema}sqlbroker_archive_maintain(
    coalesce(%(now)s::timestamptz, statement_timestamp()),
    %(ahead)s,
    coalesce(%(now)s::timestamptz, statement_timestamp()) - make_interval(secs => %(keep)s::float8))

-- name: retention_bounds
-- The longest and shortest retention a subscription has of its own (NULL: none has one).
SELECT max(archive_retention), min(archive_retention), max(dead_retention), min(dead_retention)
FROM {schema}sqlbroker_subscription

-- name: archive_trim_before
-- At most `limit` archive rows past the longest retention in force (`keep`), whatever
-- their subscription: rows that no dropped day took (the default partition, a partition
-- of older rows). The cutoff is rounded down to the day so that a day is dropped whole
-- (archive_partitions_maintain) instead of emptied row by row: such rows leave at most a
-- day late. It is a parameter, not a join, so that the days after it are pruned.
DELETE FROM {schema}sqlbroker_archive
WHERE (id, finished_at) IN (
    SELECT id, finished_at FROM {schema}sqlbroker_archive
    WHERE finished_at < date_trunc(
        'day', coalesce(%(now)s::timestamptz, statement_timestamp())
               - make_interval(secs => %(keep)s::float8), 'UTC')
    LIMIT %(limit)s
)

-- name: archive_trim_shorter
-- At most `limit` archive rows of the subscriptions whose retention is shorter than the
-- longest (`longest`), and unrouted rows when the default (`keep`) is: each through the
-- subscription's (subscription, finished_at) index. Only run when such a retention exists.
WITH settings AS (
    SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now
),
shorter AS (
    SELECT s.name, st.now - make_interval(secs => coalesce(s.archive_retention, %(keep)s::float8)) AS cutoff
    FROM {schema}sqlbroker_subscription s, settings st
    WHERE coalesce(s.archive_retention, %(keep)s::float8) < %(longest)s::float8
),
doomed AS (
    (SELECT x.id, x.finished_at FROM shorter sh
     CROSS JOIN LATERAL (
         SELECT a.id, a.finished_at FROM {schema}sqlbroker_archive a
         WHERE a.subscription = sh.name AND a.finished_at < sh.cutoff
         LIMIT %(limit)s
     ) x
     LIMIT %(limit)s)
    UNION ALL
    (SELECT a.id, a.finished_at FROM {schema}sqlbroker_archive a, settings st
     WHERE a.subscription IS NULL AND %(keep)s::float8 < %(longest)s::float8
       AND a.finished_at < st.now - make_interval(secs => %(keep)s::float8)
     LIMIT %(limit)s)
    LIMIT %(limit)s
)
DELETE FROM {schema}sqlbroker_archive a
USING doomed d WHERE a.id = d.id AND a.finished_at = d.finished_at

-- name: dead_trim_before
-- At most `limit` dead letters past the longest retention in force (`keep`).
DELETE FROM {schema}sqlbroker_dead
WHERE id IN (
    SELECT id FROM {schema}sqlbroker_dead
    WHERE dead_at < coalesce(%(now)s::timestamptz, statement_timestamp())
                    - make_interval(secs => %(keep)s::float8)
    LIMIT %(limit)s
)

-- name: dead_trim_shorter
-- At most `limit` dead letters of the subscriptions whose retention is shorter than the
-- longest (`longest`; `keep` is the default).
WITH shorter AS (
    SELECT s.name, coalesce(%(now)s::timestamptz, statement_timestamp())
                   - make_interval(secs => coalesce(s.dead_retention, %(keep)s::float8)) AS cutoff
    FROM {schema}sqlbroker_subscription s
    WHERE coalesce(s.dead_retention, %(keep)s::float8) < %(longest)s::float8
)
DELETE FROM {schema}sqlbroker_dead
WHERE id IN (
    SELECT x.id FROM shorter sh
    CROSS JOIN LATERAL (
        SELECT d.id FROM {schema}sqlbroker_dead d
        WHERE d.subscription = sh.name AND d.dead_at < sh.cutoff
        LIMIT %(limit)s
    ) x
    LIMIT %(limit)s
)
