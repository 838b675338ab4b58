-- SQLite: debounce and replace (operations/publishing.py, _replace_pending;
-- docs/flow-control.md, "Debounce and replace").

-- name: message_replace
-- As PostgreSQL's (see there): the copies of :message_id just inserted take the place of
-- their key's pending copy of the same topic, which leaves. The write lock (BEGIN
-- IMMEDIATE) serializes this with every other publisher and claim, so the new copy
-- inherits from the pending one first and the pending one is deleted after, by the same
-- test. Returns the subscription of each copy replaced (as PostgreSQL's).
UPDATE sqlbroker_message AS f
SET enqueued_at = p.enqueued_at,
    available_at = CASE
        WHEN :debounce IS NULL THEN p.available_at
        WHEN :debounce_max IS NULL THEN f.available_at
        ELSE min(f.available_at, p.enqueued_at + :debounce_max)
    END,
    state = CASE
        WHEN p.state = 'blocked' OR :debounce IS NULL THEN p.state
        WHEN f.available_at > :now
         AND (:debounce_max IS NULL OR p.enqueued_at + :debounce_max > :now) THEN 'scheduled'
        ELSE 'available'
    END
FROM sqlbroker_message AS p
-- include: message_replaced
;
DELETE FROM sqlbroker_message
WHERE id IN (
    SELECT p.id FROM sqlbroker_message f, sqlbroker_message p
-- include: message_replaced
)
RETURNING subscription

-- name: message_replaced
-- (A fragment of message_replace: f is a copy of :message_id just inserted, p the pending
-- copy it takes the place of.)
WHERE f.message_id = :message_id
  AND f.ordering_key IS NOT NULL
  AND p.id = (SELECT o.id FROM sqlbroker_message o
              WHERE o.subscription = f.subscription AND o.ordering_key = f.ordering_key
                AND o.id < f.id
              ORDER BY o.id DESC
              LIMIT 1)
  AND p.topic = f.topic
  AND p.state <> 'running' AND p.attempts = 0 AND p.replay_count = 0
