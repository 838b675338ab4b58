-- Retention (SQLite): per-subscription times and the bounded deletes of rows past their
-- time. Times are seconds since the epoch; retentions are seconds.

-- name: retention_set
UPDATE sqlbroker_subscription
SET archive_retention = CASE WHEN :change_archive THEN :archive ELSE archive_retention END,
    dead_retention = CASE WHEN :change_dead THEN :dead ELSE dead_retention END
WHERE name = :name

-- name: retention_list
SELECT name, archive_retention, dead_retention
FROM sqlbroker_subscription
WHERE :name IS NULL OR name = :name
ORDER BY name

-- name: retention_bounds
-- The longest and shortest retention a subscription has of its own (NULL: none has one).
SELECT max(archive_retention), min(archive_retention), max(dead_retention), min(dead_retention)
FROM sqlbroker_subscription

-- name: archive_trim_before
-- At most `limit` archive rows past the longest retention in force (`keep`), whatever
-- their subscription.
DELETE FROM sqlbroker_archive
WHERE id IN (
    SELECT id FROM sqlbroker_archive WHERE finished_at < :now - :keep LIMIT :limit
)

-- name: archive_trim_shorter
-- At most `limit` archive rows of the subscriptions whose retention is shorter than the
-- longest (`longest`), and unrouted rows when the default (`keep`) is: each through the
-- (subscription, finished_at) index. (The DELETE comes first: Python's sqlite3 counts the
-- rows of a statement that starts with DELETE, not of one that starts with WITH.)
DELETE FROM sqlbroker_archive
WHERE id IN (
    WITH shorter AS (
        SELECT name, :now - coalesce(archive_retention, :keep) AS cutoff
        FROM sqlbroker_subscription
        WHERE coalesce(archive_retention, :keep) < :longest
    )
    SELECT id FROM (
        SELECT a.id FROM shorter sh
        JOIN sqlbroker_archive a ON a.subscription = sh.name AND a.finished_at < sh.cutoff
        LIMIT :limit
    )
    UNION ALL
    SELECT id FROM (
        SELECT id FROM sqlbroker_archive
        WHERE subscription IS NULL AND :keep < :longest AND finished_at < :now - :keep
        LIMIT :limit
    )
    LIMIT :limit
)

-- name: dead_trim_before
-- At most `limit` dead letters past the longest retention in force (`keep`).
DELETE FROM sqlbroker_dead
WHERE id IN (SELECT id FROM sqlbroker_dead WHERE dead_at < :now - :keep LIMIT :limit)

-- name: dead_trim_shorter
-- At most `limit` dead letters of the subscriptions whose retention is shorter than the
-- longest (`longest`; `keep` is the default).
DELETE FROM sqlbroker_dead
WHERE id IN (
    WITH shorter AS (
        SELECT name, :now - coalesce(dead_retention, :keep) AS cutoff
        FROM sqlbroker_subscription
        WHERE coalesce(dead_retention, :keep) < :longest
    )
    SELECT d.id FROM shorter sh
    JOIN sqlbroker_dead d ON d.subscription = sh.name AND d.dead_at < sh.cutoff
    LIMIT :limit
)
