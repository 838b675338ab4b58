-- PostgreSQL: debounce and replace (operations/publishing.py, _replace_pending;
-- docs/flow-control.md, "Debounce and replace").

-- name: message_replace
-- The copies of %(message_id)s just inserted take the place of their key's pending copy:
-- where the copy just before one (same subscription and ordering key) is of the same
-- topic and never claimed, it takes the new copy's id, payload and options, keeps its
-- place and first enqueue time, and keeps its available time unless %(debounce)s is set:
-- then the new copy's (now + debounce), but never later than enqueued_at +
-- %(debounce_max)s. The caller holds the key's lock (key_lock), so no publisher of the
-- key runs in between; a claim that locked the pending copy first wins, as the state and
-- attempts are checked again on the row once it is locked. Returns (replaced, notified).
WITH replaced AS (
    UPDATE {schema}sqlbroker_message m
    SET message_id = f.message_id, payload = f.payload, content_type = f.content_type,
        headers = f.headers, priority = f.priority, idempotency_key = f.idempotency_key,
        max_attempts = f.max_attempts, expires_at = f.expires_at,
        available_at = CASE
            WHEN %(debounce)s::float8 IS NULL THEN m.available_at
            WHEN %(debounce_max)s::float8 IS NULL THEN f.available_at
            ELSE least(f.available_at, m.enqueued_at + make_interval(secs => %(debounce_max)s::float8))
        END,
        state = CASE
            WHEN m.state = 'blocked' OR %(debounce)s::float8 IS NULL THEN m.state
            WHEN f.available_at > coalesce(%(now)s::timestamptz, statement_timestamp())
             AND (%(debounce_max)s::float8 IS NULL
                  OR m.enqueued_at + make_interval(secs => %(debounce_max)s::float8)
                     > coalesce(%(now)s::timestamptz, statement_timestamp()))
                THEN 'scheduled'
            ELSE 'available'
        END
    FROM {schema}sqlbroker_message f
    WHERE f.message_id = %(message_id)s::uuid
      AND f.ordering_key IS NOT NULL
      AND m.id = (SELECT o.id FROM {schema}sqlbroker_message o
                  WHERE o.subscription = f.subscription AND o.ordering_key = f.ordering_key
                    AND o.id < f.id
                  ORDER BY o.id DESC
                  LIMIT 1)
      AND m.topic = f.topic
      AND m.state <> 'running' AND m.attempts = 0 AND m.replay_count = 0
    RETURNING m.subscription, m.state
)
SELECT (SELECT count(*) FROM replaced) AS replaced,
       (SELECT count(*) FROM (
            SELECT pg_notify(%(channel)s, s.subscription)
            FROM (SELECT DISTINCT subscription FROM replaced WHERE state = 'available') s
       ) n) AS notified

-- name: message_replace_drop
-- The new copies of %(message_id)s that message_replace folded into a pending copy (which
-- now carries their id, earlier in their subscription) leave.
DELETE FROM {schema}sqlbroker_message f
WHERE f.message_id = %(message_id)s::uuid
  AND EXISTS (SELECT 1 FROM {schema}sqlbroker_message p
              WHERE p.message_id = %(message_id)s::uuid
                AND p.subscription = f.subscription AND p.id < f.id)
