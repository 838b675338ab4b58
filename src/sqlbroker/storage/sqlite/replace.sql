-- SQLite: debounce and replace (operations/publishing.py, _replace_pending;
-- docs/flow-control.md, "Debounce and replace").

-- name: message_replace
-- As PostgreSQL's (see there): the copies of :message_id just inserted take the place of
-- their key's pending copy of the same topic. The write lock (BEGIN IMMEDIATE) serializes
-- it with every other publisher and claim. Returns (replaced, notified).
UPDATE sqlbroker_message AS m
SET message_id = f.message_id, payload = f.payload, content_type = f.content_type,
    headers = f.headers, priority = f.priority, idempotency_key = f.idempotency_key,
    max_attempts = f.max_attempts, expires_at = f.expires_at,
    available_at = CASE
        WHEN :debounce IS NULL THEN m.available_at
        WHEN :debounce_max IS NULL THEN f.available_at
        ELSE min(f.available_at, m.enqueued_at + :debounce_max)
    END,
    state = CASE
        WHEN m.state = 'blocked' OR :debounce IS NULL THEN m.state
        WHEN f.available_at > :now
         AND (:debounce_max IS NULL OR m.enqueued_at + :debounce_max > :now) THEN 'scheduled'
        ELSE 'available'
    END
FROM sqlbroker_message AS f
WHERE f.message_id = :message_id
  AND f.ordering_key IS NOT NULL
  AND m.id = (SELECT o.id FROM sqlbroker_message o
              WHERE o.subscription = f.subscription AND o.ordering_key = f.ordering_key
                AND o.id < f.id
              ORDER BY o.id DESC
              LIMIT 1)
  -- The new copy is the last of its id in its subscription: never a pending copy that
  -- this statement already gave that id.
  AND f.id = (SELECT max(z.id) FROM sqlbroker_message z
              WHERE z.message_id = :message_id AND z.subscription = f.subscription)
  AND m.topic = f.topic
  AND m.state <> 'running' AND m.attempts = 0 AND m.replay_count = 0;
SELECT changes() AS replaced, 0 AS notified

-- name: message_replace_drop
DELETE FROM sqlbroker_message AS f
WHERE f.message_id = :message_id
  AND EXISTS (SELECT 1 FROM sqlbroker_message p
              WHERE p.message_id = :message_id
                AND p.subscription = f.subscription AND p.id < f.id)
