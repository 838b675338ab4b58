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

-- name: archive_retain
-- At most `limit` archive rows past their retention: those past the longest retention in
-- force (whatever their subscription, deleted ones included), then the rows of the
-- subscriptions (and unrouted rows: the default) whose retention is shorter.
-- (The DELETE comes first: Python's sqlite3 counts the rows of a statement that starts
-- with DELETE, not of one that starts with WITH.)
DELETE FROM sqlbroker_archive WHERE id IN (
    WITH settings AS (
        SELECT :now AS now, :default AS keep,
               max(:default, coalesce((SELECT max(archive_retention) FROM sqlbroker_subscription), 0))
                   AS longest
    ),
    shorter AS (
        SELECT s.name, st.now - coalesce(s.archive_retention, st.keep) AS cutoff
        FROM sqlbroker_subscription s, settings st
        WHERE coalesce(s.archive_retention, st.keep) < st.longest
    ),
    doomed AS (
        SELECT id FROM (
            SELECT a.id FROM sqlbroker_archive a, settings st
            WHERE a.finished_at < st.now - st.longest
            LIMIT :limit
        )
        UNION ALL
        SELECT id FROM (
            SELECT a.id FROM shorter sh
            JOIN sqlbroker_archive a ON a.subscription = sh.name AND a.finished_at < sh.cutoff
            LIMIT :limit
        )
        UNION ALL
        SELECT id FROM (
            SELECT a.id FROM sqlbroker_archive a, settings st
            WHERE a.subscription IS NULL AND st.keep < st.longest
              AND a.finished_at < st.now - st.keep
            LIMIT :limit
        )
        LIMIT :limit
    )
    SELECT id FROM doomed
)

-- name: dead_retain
-- At most `limit` dead letters past their retention: the subscription's own or the
-- default; dead letters of deleted subscriptions follow the longest one in force.
-- (The DELETE comes first: Python's sqlite3 counts the rows of a statement that starts
-- with DELETE, not of one that starts with WITH.)
DELETE FROM sqlbroker_dead WHERE id IN (
    WITH settings AS (
        SELECT :now AS now, :default AS keep,
               max(:default, coalesce((SELECT max(dead_retention) FROM sqlbroker_subscription), 0))
                   AS longest
    ),
    shorter AS (
        SELECT s.name, st.now - coalesce(s.dead_retention, st.keep) AS cutoff
        FROM sqlbroker_subscription s, settings st
        WHERE coalesce(s.dead_retention, st.keep) < st.longest
    ),
    doomed AS (
        SELECT id FROM (
            SELECT d.id FROM sqlbroker_dead d, settings st
            WHERE d.dead_at < st.now - st.longest
            LIMIT :limit
        )
        UNION ALL
        SELECT id FROM (
            SELECT d.id FROM shorter sh
            JOIN sqlbroker_dead d ON d.subscription = sh.name AND d.dead_at < sh.cutoff
            LIMIT :limit
        )
        LIMIT :limit
    )
    SELECT id FROM doomed
)
