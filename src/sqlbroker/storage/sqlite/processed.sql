-- Processed keys (see migrations/0002_processed_keys.sql). Times are Unix seconds.

-- name: processed_reserve
-- Take the key unless it is done and unexpired, or reserved by a holder whose lease runs.
INSERT INTO sqlbroker_processed AS p
    (scope, key, state, token, reserved_until, created_at, done_at, expires_at)
VALUES (:scope, :key, 'reserved', :token, :now + :lease, :now, NULL, :now + :window)
ON CONFLICT (scope, key) DO UPDATE SET
    state = 'reserved', token = excluded.token, reserved_until = excluded.reserved_until,
    created_at = excluded.created_at, done_at = NULL, expires_at = excluded.expires_at
WHERE p.expires_at <= :now OR (p.state = 'reserved' AND p.reserved_until <= :now)
RETURNING token

-- name: processed_get
SELECT state, reserved_until, done_at, expires_at FROM sqlbroker_processed
WHERE scope = :scope AND key = :key

-- name: processed_confirm
UPDATE sqlbroker_processed
SET state = 'done', done_at = :now, expires_at = :now + :window
-- include: processed_ours

-- name: processed_extend
UPDATE sqlbroker_processed SET reserved_until = :now + :lease
-- include: processed_ours

-- name: processed_release
DELETE FROM sqlbroker_processed
-- include: processed_ours

-- name: processed_forget
DELETE FROM sqlbroker_processed WHERE scope = :scope AND key = :key

-- name: processed_trim
DELETE FROM sqlbroker_processed
WHERE (scope, key) IN (
    SELECT scope, key FROM sqlbroker_processed
    WHERE expires_at <= :now AND (state = 'done' OR reserved_until <= :now)
    LIMIT :limit
)

-- name: processed_ours
-- (A fragment: the key, while it is reserved under our token.)
WHERE scope = :scope AND key = :key AND token = :token AND state = 'reserved'
