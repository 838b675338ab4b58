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
-- (the default or a subscription's own); shorter ones are applied by archive_retain.
SELECT {schema}sqlbroker_archive_maintain(
    coalesce(%(now)s::timestamptz, statement_timestamp()),
    %(ahead)s,
    coalesce(%(now)s::timestamptz, statement_timestamp()) - make_interval(secs => greatest(
        %(default)s::float8,
        (SELECT max(archive_retention) FROM {schema}sqlbroker_subscription))))

-- name: archive_retain
-- At most `limit` archive rows past their retention: first those past the longest
-- retention that no dropped day took (rows in the default partition or a partially
-- expired day before the longest retention's day; rows are removed at most a day late, so
-- that a day is dropped whole instead of emptied row by row), then the rows of the
-- subscriptions (and unrouted rows: the default) whose retention is shorter.
WITH settings AS (
    SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now,
           %(default)s::float8 AS keep,
           greatest(%(default)s::float8,
                    (SELECT max(archive_retention) FROM {schema}sqlbroker_subscription)) AS longest
),
shorter AS (
    SELECT s.name, st.now - make_interval(secs => coalesce(s.archive_retention, st.keep)) AS cutoff
    FROM {schema}sqlbroker_subscription s, settings st
    WHERE coalesce(s.archive_retention, st.keep) < st.longest
),
doomed AS (
    (SELECT a.id, a.finished_at FROM {schema}sqlbroker_archive a, settings st
     WHERE a.finished_at < date_trunc('day', st.now - make_interval(secs => st.longest), 'UTC')
     LIMIT %(limit)s)
    UNION ALL
    (SELECT x.id, x.finished_at FROM shorter sh
     CROSS JOIN LATERAL (
         SELECT a.id, a.finished_at FROM {schema}sqlbroker_archive a
         WHERE a.subscription = sh.name AND a.finished_at < sh.cutoff
         LIMIT %(limit)s
     ) x
     LIMIT %(limit)s)
    UNION ALL
    (SELECT a.id, a.finished_at FROM {schema}sqlbroker_archive a, settings st
     WHERE a.subscription IS NULL AND st.keep < st.longest
       AND a.finished_at < st.now - make_interval(secs => st.keep)
     LIMIT %(limit)s)
    LIMIT %(limit)s
)
DELETE FROM {schema}sqlbroker_archive a
USING doomed d WHERE a.id = d.id AND a.finished_at = d.finished_at

-- name: dead_retain
-- At most `limit` dead letters past their retention: the subscription's own or the
-- default; dead letters of deleted subscriptions follow the longest one in force.
WITH settings AS (
    SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now,
           %(default)s::float8 AS keep,
           greatest(%(default)s::float8,
                    (SELECT max(dead_retention) FROM {schema}sqlbroker_subscription)) AS longest
),
shorter AS (
    SELECT s.name, st.now - make_interval(secs => coalesce(s.dead_retention, st.keep)) AS cutoff
    FROM {schema}sqlbroker_subscription s, settings st
    WHERE coalesce(s.dead_retention, st.keep) < st.longest
),
doomed AS (
    (SELECT d.id FROM {schema}sqlbroker_dead d, settings st
     WHERE d.dead_at < st.now - make_interval(secs => st.longest)
     LIMIT %(limit)s)
    UNION ALL
    (SELECT x.id FROM shorter sh
     CROSS JOIN LATERAL (
         SELECT d.id FROM {schema}sqlbroker_dead d
         WHERE d.subscription = sh.name AND d.dead_at < sh.cutoff
         LIMIT %(limit)s
     ) x
     LIMIT %(limit)s)
    LIMIT %(limit)s
)
DELETE FROM {schema}sqlbroker_dead WHERE id IN (SELECT id FROM doomed)
