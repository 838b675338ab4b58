-- Stored results (docs/results.md): the lookup by message id and the retention trim.

-- name: result_lookup
-- Every trace of the message's copies, one row each: still in the hot table (pending), a
-- stored value, a dead letter, an archive row. The caller picks, per subscription, what
-- the copy's result is (features/results.py). Each branch is an index probe on message_id.
SELECT subscription, 'pending' AS outcome, NULL::bytea AS value, NULL::text AS reason,
       NULL::text AS error_type, NULL::text AS error_message, NULL::text AS traceback,
       NULL::timestamptz AS finished_at
FROM {schema}sqlbroker_message WHERE message_id = %(message_id)s::uuid
UNION ALL
SELECT subscription, 'value', value, NULL, NULL, NULL, NULL, finished_at
FROM {schema}sqlbroker_result WHERE message_id = %(message_id)s::uuid
UNION ALL
SELECT subscription, 'dead', NULL, reason, error_type, error_message, traceback, dead_at
FROM {schema}sqlbroker_dead WHERE message_id = %(message_id)s::uuid
UNION ALL
SELECT subscription, outcome, NULL, NULL, NULL, NULL, NULL, finished_at
FROM {schema}sqlbroker_archive WHERE message_id = %(message_id)s::uuid

-- name: result_trim
-- Results older than the retention (``ttl`` seconds, by the database's clock), oldest first,
-- at most ``limit`` of them.
DELETE FROM {schema}sqlbroker_result
WHERE delivery_id = ANY (ARRAY(
    SELECT delivery_id FROM {schema}sqlbroker_result
    WHERE finished_at < coalesce(%(now)s::timestamptz, statement_timestamp())
                        - make_interval(secs => %(ttl)s)
    ORDER BY finished_at LIMIT %(limit)s
))
