-- PostgreSQL: debounce and replace (operations/publishing.py, _replace_pending;
-- docs/flow-control.md, "Debounce and replace").

-- name: message_replace
-- The copies of %(message_id)s just inserted take the place of their key's pending copy:
-- where the copy just before one (same subscription and ordering key) is of the same
-- topic and never claimed, that copy leaves and the new one inherits its state, its first
-- enqueue time and its available time — unless %(debounce)s is set: then the new copy's
-- own (now + debounce), but never later than the first enqueue + %(debounce_max)s. The
-- caller holds the key's lock (key_lock), so no publisher of the key runs in between; a
-- claim that locked the pending copy first wins: the DELETE checks the state and attempts
-- again once it has the row, skips a copy claimed since, and the new copy then stays
-- blocked behind it. Only the columns a consumer may update are written (the message_id,
-- subscription and topic of a copy never change). Returns the subscription of each copy
-- that took a pending copy's place (the caller counts them in the lifetime totals).
WITH gone AS (
    DELETE FROM {schema}sqlbroker_message p
    USING {schema}sqlbroker_message f
    WHERE f.message_id = %(message_id)s::uuid
      AND f.ordering_key IS NOT NULL
      AND p.id = (SELECT o.id FROM {schema}sqlbroker_message o
                  WHERE o.subscription = f.subscription AND o.ordering_key = f.ordering_key
                    AND o.id < f.id
                  ORDER BY o.id DESC
                  LIMIT 1)
      AND p.topic = f.topic
      AND p.state <> 'running' AND p.attempts = 0 AND p.replay_count = 0
    RETURNING p.subscription, p.state, p.enqueued_at, p.available_at
),
took AS (
    UPDATE {schema}sqlbroker_message f
    SET enqueued_at = g.enqueued_at,
        available_at = CASE
            WHEN %(debounce)s::float8 IS NULL THEN g.available_at
            WHEN %(debounce_max)s::float8 IS NULL THEN f.available_at
            ELSE least(f.available_at, g.enqueued_at + make_interval(secs => %(debounce_max)s::float8))
        END,
        state = CASE
            WHEN g.state = 'blocked' OR %(debounce)s::float8 IS NULL THEN g.state
            WHEN f.available_at > coalesce(%(now)s::timestamptz, statement_timestamp())
             AND (%(debounce_max)s::float8 IS NULL
                  OR g.enqueued_at + make_interval(secs => %(debounce_max)s::float8)
                     > coalesce(%(now)s::timestamptz, statement_timestamp()))
                THEN 'scheduled'
            ELSE 'available'
        END
    FROM gone g
    WHERE f.message_id = %(message_id)s::uuid AND f.subscription = g.subscription
    RETURNING f.subscription, f.state
),
notified AS (
    SELECT pg_notify(%(channel)s, s.subscription)
    FROM (SELECT DISTINCT subscription FROM took WHERE state = 'available') s
)
SELECT t.subscription FROM took t, (SELECT count(*) FROM notified) n
