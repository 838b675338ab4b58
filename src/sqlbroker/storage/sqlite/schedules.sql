-- SQLite queries of sqlbroker's schedules. Times are REAL seconds since the Unix epoch.

-- name: schedule_upsert
-- An identical definition changes nothing (not even updated_at); the same timing keeps the
-- next run and the interval's anchor; anything else takes them from the new definition.
-- The parameters are the fields of a ScheduleDefinition (storage/schedules.py).
INSERT INTO sqlbroker_schedule AS s (
    name, topic, cron, every_seconds, tz, missed, grace_seconds, start_at, anchor_at,
    payload, content_type, headers, priority, ordering_key, ttl_seconds, max_attempts,
    definition_hash, timing_hash, next_run_at, created_at, updated_at
) VALUES (
    :name, :topic, :cron, :every, :tz, :missed, :grace, :start_at, :anchor_at,
    :payload, :content_type, :headers, :priority, :ordering_key, :ttl, :max_attempts,
    :definition_hash, :timing_hash, :next_run_at, :now, :now
)
ON CONFLICT (name) DO UPDATE SET
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
SELECT * FROM sqlbroker_schedule
WHERE :names IS NULL OR name IN (SELECT value FROM json_each(:names))
ORDER BY name

-- name: schedule_delete
DELETE FROM sqlbroker_schedule WHERE name = :name

-- name: schedule_set_paused
-- Pause, or resume from :next_run_at; resuming a schedule that runs changes nothing, yet
-- its row counts, so that the row count says whether the schedule exists.
UPDATE sqlbroker_schedule
SET paused = :paused,
    next_run_at = CASE WHEN paused AND NOT :paused THEN :next_run_at ELSE next_run_at END,
    updated_at = CASE WHEN paused OR :paused THEN :now ELSE updated_at END
WHERE name = :name

-- name: schedule_due
-- The clock's now and the earliest next run of the schedules not due travel with the due
-- rows (one row of NULLs when none is due), so that the caller plans against the very time
-- that made them due.
WITH t AS (SELECT :now AS now)
SELECT t.now AS clock_now,
       (SELECT min(next_run_at) FROM sqlbroker_schedule
        WHERE paused = 0 AND next_run_at > t.now) AS clock_next_run,
       s.*
FROM t LEFT JOIN (
    SELECT * FROM sqlbroker_schedule
    WHERE paused = 0 AND next_run_at <= :now
    ORDER BY next_run_at, name
    LIMIT :limit
) s ON true
ORDER BY s.next_run_at, s.name

-- name: schedule_advance
-- The compare-and-set that makes a tick publish once however many schedulers race: only
-- the scheduler that still finds the next run it planned from moves it on.
UPDATE sqlbroker_schedule
SET next_run_at = :next_run_at,
    last_run_at = coalesce(:last_run_at, last_run_at),
    last_message_id = coalesce(:last_message_id, last_message_id)
WHERE name = :name
  AND next_run_at = :expected_next_run_at
  AND definition_hash = :definition_hash
  AND paused = 0

-- name: schedule_last_message
UPDATE sqlbroker_schedule SET last_message_id = :last_message_id WHERE name = :name
