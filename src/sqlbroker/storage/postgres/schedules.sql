-- PostgreSQL queries of sqlbroker's schedules. %(now)s is NULL unless a test clock
-- overrides the database clock.

-- name: schedule_upsert
-- An identical definition changes nothing (not even updated_at); the same timing keeps the
-- next run and the interval's anchor; anything else takes them from the new definition.
-- The parameters are the fields of a ScheduleDefinition (storage/schedules.py).
INSERT INTO {schema}sqlbroker_schedule AS s (
    name, topic, cron, every_seconds, tz, missed, grace_seconds, start_at, anchor_at,
    payload, content_type, headers, priority, ordering_key, ttl_seconds, max_attempts,
    definition_hash, timing_hash, next_run_at, created_at, updated_at
) VALUES (
    %(name)s, %(topic)s, %(cron)s, %(every)s, %(tz)s, %(missed)s, %(grace)s,
    %(start_at)s, %(anchor_at)s, %(payload)s, %(content_type)s, %(headers)s, %(priority)s,
    %(ordering_key)s, %(ttl)s, %(max_attempts)s, %(definition_hash)s, %(timing_hash)s,
    %(next_run_at)s,
    coalesce(%(now)s::timestamptz, statement_timestamp()),
    coalesce(%(now)s::timestamptz, statement_timestamp())
)
-- tenant: names are per tenant (migration 0009; '' unless tenants are enabled)
ON CONFLICT (name, tenant) DO UPDATE SET
    topic = excluded.topic,
    cron = excluded.cron,
    every_seconds = excluded.every_seconds,
    tz = excluded.tz,
    missed = excluded.missed,
    grace_seconds = excluded.grace_seconds,
    start_at = excluded.start_at,
    anchor_at = CASE WHEN s.timing_hash = excluded.timing_hash THEN s.anchor_at
                     ELSE excluded.anchor_at END,
    payload = excluded.payload,
    content_type = excluded.content_type,
    headers = excluded.headers,
    priority = excluded.priority,
    ordering_key = excluded.ordering_key,
    ttl_seconds = excluded.ttl_seconds,
    max_attempts = excluded.max_attempts,
    definition_hash = excluded.definition_hash,
    next_run_at = CASE WHEN s.timing_hash = excluded.timing_hash THEN s.next_run_at
                       ELSE excluded.next_run_at END,
    timing_hash = excluded.timing_hash,
    updated_at = excluded.updated_at
WHERE s.definition_hash <> excluded.definition_hash

-- name: schedule_list
SELECT * FROM {schema}sqlbroker_schedule
WHERE %(names)s::text[] IS NULL OR name = ANY (%(names)s::text[])
ORDER BY name

-- name: schedule_delete
DELETE FROM {schema}sqlbroker_schedule WHERE name = %(name)s

-- name: schedule_set_paused
-- Pause, or resume from %(next_run_at)s; resuming a schedule that runs changes nothing, yet
-- its row counts, so that the row count says whether the schedule exists.
UPDATE {schema}sqlbroker_schedule
SET paused = %(paused)s,
    next_run_at = CASE WHEN paused AND NOT %(paused)s THEN %(next_run_at)s::timestamptz
                       ELSE next_run_at END,
    updated_at = CASE WHEN paused OR %(paused)s
                      THEN coalesce(%(now)s::timestamptz, statement_timestamp())
                      ELSE updated_at END
WHERE name = %(name)s

-- name: schedule_due
-- The clock's now and the earliest next run of the schedules not due travel with the due
-- rows (one row of NULLs when none is due), so that the caller plans against the very time
-- that made them due.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT t.now AS clock_now,
       (SELECT min(next_run_at) FROM {schema}sqlbroker_schedule
        WHERE NOT paused AND next_run_at > t.now) AS clock_next_run,
       s.*
FROM t LEFT JOIN LATERAL (
    SELECT * FROM {schema}sqlbroker_schedule
    WHERE NOT paused AND next_run_at <= t.now
    ORDER BY next_run_at, name
    LIMIT %(limit)s
) s ON true
ORDER BY s.next_run_at, s.name

-- name: schedule_advance
-- The compare-and-set that makes a tick publish once however many schedulers race: the
-- row lock makes a second scheduler wait, and READ COMMITTED then re-checks its WHERE
-- against the committed row, whose next run has moved on, so it updates nothing.
UPDATE {schema}sqlbroker_schedule
SET next_run_at = %(next_run_at)s,
    last_run_at = coalesce(%(last_run_at)s, last_run_at),
    last_message_id = coalesce(%(last_message_id)s::uuid, last_message_id)
WHERE name = %(name)s
  AND next_run_at = %(expected_next_run_at)s
  AND definition_hash = %(definition_hash)s
  AND NOT paused

-- name: schedule_last_message
UPDATE {schema}sqlbroker_schedule SET last_message_id = %(last_message_id)s::uuid
WHERE name = %(name)s
