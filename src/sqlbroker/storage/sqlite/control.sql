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
INSERT INTO sqlbroker_archive (
    delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
    idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
    enqueued_at, first_started_at, finished_at
)
SELECT m.id, m.message_id, m.subscription, m.topic, 'cancelled', m.priority, m.ordering_key,
       m.idempotency_key, m.payload, m.content_type, m.headers, m.attempts, m.max_attempts,
       m.replay_count, m.enqueued_at, m.first_started_at, :now
FROM sqlbroker_message m
JOIN (SELECT i.value AS id, t.value AS token FROM json_each(:ids) i
      CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key) l ON l.id = m.id AND l.token = m.lease_token
WHERE m.state = 'running'
ORDER BY m.id;
DELETE FROM sqlbroker_message
WHERE state = 'running' AND (id, lease_token) IN (SELECT i.value AS id, t.value AS token FROM json_each(:ids) i
      CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key)
RETURNING id, subscription, ordering_key, state

-- name: lease_expired_cancelled
-- Two statements, as in message_dead: cancelled copies whose worker was lost (their lease
-- expired) end cancelled instead of going back to the queue.
-- include: archive_copies
       'cancelled'
FROM sqlbroker_message
WHERE id IN (SELECT id FROM sqlbroker_message
             WHERE state = 'running' AND lease_expires_at <= :now AND cancel_requested
             ORDER BY lease_expires_at, id
             LIMIT :limit)
ORDER BY id;
DELETE FROM sqlbroker_message
WHERE id IN (SELECT id FROM sqlbroker_message
             WHERE state = 'running' AND lease_expires_at <= :now AND cancel_requested
             ORDER BY lease_expires_at, id
             LIMIT :limit)
RETURNING id, subscription, ordering_key, state
