-- Stored results (docs/results.md): the values written with a complete, the lookup by
-- message id and the retention trim.

-- name: result_lookup
-- Every trace of the message's copies, one row each: still in the hot table (pending), a
-- stored value, a dead letter, an archive row. The caller picks, per subscription, what
-- the copy's result is (features/results.py). Each branch is an index probe on message_id.
SELECT subscription, 'pending' AS outcome, NULL AS value, NULL AS reason, NULL AS error_type,
       NULL AS error_message, NULL AS traceback, NULL AS finished_at
FROM sqlbroker_message WHERE message_id = :message_id
UNION ALL
SELECT subscription, 'value', value, NULL, NULL, NULL, NULL, finished_at
FROM sqlbroker_result WHERE message_id = :message_id
UNION ALL
SELECT subscription, 'dead', NULL, reason, error_type, error_message, traceback, dead_at
FROM sqlbroker_dead WHERE message_id = :message_id
UNION ALL
SELECT subscription, outcome, NULL, NULL, NULL, NULL, NULL, finished_at
FROM sqlbroker_archive WHERE message_id = :message_id

-- name: result_trim
-- Results older than the retention (``ttl`` seconds), oldest first, at most ``limit``.
DELETE FROM sqlbroker_result
WHERE delivery_id IN (
    SELECT delivery_id FROM sqlbroker_result WHERE finished_at < :now - :ttl
    ORDER BY finished_at LIMIT :limit
)
