-- Pause and cancel (storage/operations/control.py, docs/flow-control.md).

-- name: subscription_set_paused
UPDATE sqlbroker_subscription SET paused = :paused WHERE name = :name
RETURNING name

-- name: message_cancel_request
-- Running copies of these messages: their workers find the flag and stop the handlers.
UPDATE sqlbroker_message SET cancel_requested = 1
WHERE message_id IN (SELECT value FROM json_each(:message_ids)) AND state = 'running'
RETURNING id, subscription

-- name: message_cancel_requested
SELECT id FROM sqlbroker_message
WHERE id IN (SELECT value FROM json_each(:ids)) AND cancel_requested
ORDER BY id

-- name: message_cancel_leased
-- Two statements, as in message_dead: running copies whose cancel reached their worker.
-- include: archive_copies
       'cancelled'
FROM sqlbroker_message
WHERE state = 'running' AND (id, lease_token) IN
-- include: leases_given
ORDER BY id;
DELETE FROM sqlbroker_message
WHERE state = 'running' AND (id, lease_token) IN
-- include: leases_given
RETURNING id, subscription, ordering_key, state

-- name: lease_expired_cancelled
-- Two statements, as in message_dead: cancelled copies whose worker was lost (their lease
-- expired) end cancelled instead of going back to the queue.
-- include: archive_copies
       'cancelled'
FROM sqlbroker_message
-- include: cancelled_expired
ORDER BY id;
DELETE FROM sqlbroker_message
-- include: cancelled_expired
RETURNING id, subscription, ordering_key, state

-- name: cancelled_expired
-- (A fragment: the copies lease_expired_cancelled takes, at most :limit.)
WHERE id IN (SELECT id FROM sqlbroker_message
             WHERE state = 'running' AND lease_expires_at <= :now AND cancel_requested
             ORDER BY lease_expires_at, id
             LIMIT :limit)
