-- Processed keys (see migrations/0002_processed_keys.sql).
-- %(now)s is NULL unless a test clock overrides the database clock.

-- name: processed_reserve
-- Take the key unless it is done and unexpired, or reserved by a holder whose lease runs.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO {schema}sqlbroker_processed AS p
    (scope, key, state, token, reserved_until, created_at, done_at, expires_at)
SELECT %(scope)s, %(key)s, 'reserved', %(token)s::uuid,
       t.now + make_interval(secs => %(lease)s), t.now, NULL,
       t.now + make_interval(secs => %(window)s)
FROM t
-- tenant: names are per tenant (migration 0009; '' unless tenants are enabled)
ON CONFLICT (scope, key, tenant) DO UPDATE SET
    state = 'reserved', token = excluded.token, reserved_until = excluded.reserved_until,
    created_at = excluded.created_at, done_at = NULL, expires_at = excluded.expires_at
WHERE p.expires_at <= excluded.created_at
   OR (p.state = 'reserved' AND p.reserved_until <= excluded.created_at)
RETURNING token

-- name: processed_get
SELECT state, reserved_until, done_at, expires_at FROM {schema}sqlbroker_processed
WHERE scope = %(scope)s AND key = %(key)s

-- name: processed_confirm
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE {schema}sqlbroker_processed
SET state = 'done', done_at = t.now, expires_at = t.now + make_interval(secs => %(window)s)
FROM t
-- include: processed_ours

-- name: processed_extend
UPDATE {schema}sqlbroker_processed
SET reserved_until = coalesce(%(now)s::timestamptz, statement_timestamp())
                     + make_interval(secs => %(lease)s)
-- include: processed_ours

-- name: processed_release
DELETE FROM {schema}sqlbroker_processed
-- include: processed_ours

-- name: processed_forget
DELETE FROM {schema}sqlbroker_processed WHERE scope = %(scope)s AND key = %(key)s

-- name: processed_trim
WITH t AS (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS now)
DELETE FROM {schema}sqlbroker_processed
WHERE ctid = ANY (ARRAY(
    SELECT p.ctid FROM {schema}sqlbroker_processed p, t
    WHERE p.expires_at <= t.now AND (p.state = 'done' OR p.reserved_until <= t.now)
    LIMIT %(limit)s
))

-- name: processed_ours
-- (A fragment: the key, while it is reserved under our token.)
WHERE scope = %(scope)s AND key = %(key)s AND token = %(token)s::uuid AND state = 'reserved'
