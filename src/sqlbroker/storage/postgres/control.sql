-- Pause and cancel (storage/operations/control.py, docs/flow-control.md).

-- name: subscription_set_paused
UPDATE {schema}sqlbroker_subscription SET paused = %(paused)s WHERE name = %(name)s
RETURNING name

-- name: message_cancel_request
-- Running copies of these messages: their workers find the flag and stop the handlers.
UPDATE {schema}sqlbroker_message SET cancel_requested = true
WHERE message_id = ANY (%(message_ids)b::uuid[]) AND state = 'running'
RETURNING id, subscription

-- name: message_cancel_requested
SELECT id FROM {schema}sqlbroker_message
WHERE id = ANY (%(ids)b::bigint[]) AND cancel_requested
ORDER BY id

-- name: lease_expired_cancelled
-- Cancelled copies whose worker was lost (their lease expired) end cancelled instead of
-- going back to the queue.
WITH c AS (
    SELECT id FROM {schema}sqlbroker_message
    WHERE state = 'running' AND cancel_requested
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
    ORDER BY lease_expires_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}sqlbroker_message m USING c WHERE m.id = c.id
    RETURNING m.*, 'cancelled'::text AS outcome
),
-- include: gone_archived
SELECT id, subscription, ordering_key, state FROM gone ORDER BY id
