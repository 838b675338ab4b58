-- SQLite queries of sqlbroker. Named parameters (:name); times are REAL Unix seconds.
-- Batches arrive as one JSON array parameter (:batch) read with json_each.

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS sqlbroker_schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)

-- name: schema_version
SELECT coalesce(max(version), 0) FROM sqlbroker_schema_version

-- name: schema_version_exists
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sqlbroker_schema_version'

-- name: schema_version_insert
INSERT INTO sqlbroker_schema_version (version, name, applied_at) VALUES (:version, :name, :now)

-- name: schema_version_printed
-- The version row of one migration in the printed schema (``sqlbroker schema --print``),
-- which runs with no parameters: {version} and {name} come from the migration's file name.
INSERT INTO sqlbroker_schema_version (version, name, applied_at)
VALUES ({version}, '{name}', (julianday('now') - 2440587.5) * 86400.0)

-- name: subscription_insert
INSERT INTO sqlbroker_subscription (name, created_at) VALUES (:name, :now)
ON CONFLICT (name) DO NOTHING

-- name: subscription_patterns_clear
DELETE FROM sqlbroker_subscription_pattern WHERE subscription = :name

-- name: subscription_get
SELECT s.name, s.created_at, p.pattern
FROM sqlbroker_subscription s
LEFT JOIN sqlbroker_subscription_pattern p ON p.subscription = s.name
WHERE s.name = :name
ORDER BY p.pattern

-- name: subscription_list
SELECT s.name, s.created_at, p.pattern
FROM sqlbroker_subscription s
LEFT JOIN sqlbroker_subscription_pattern p ON p.subscription = s.name
ORDER BY s.name, p.pattern

-- name: dedupe_trim
DELETE FROM sqlbroker_dedupe
WHERE (topic, idempotency_key) IN (
    SELECT topic, idempotency_key FROM sqlbroker_dedupe WHERE expires_at <= :now LIMIT :limit
)

-- name: subscription_patterns_insert
INSERT INTO sqlbroker_subscription_pattern (subscription, pattern, regex)
SELECT :name, p.value, r.value
FROM json_each(:patterns) p CROSS JOIN (SELECT key, value FROM json_each(:regexes) LIMIT -1) r ON r.key = p.key
WHERE true
ON CONFLICT (subscription, pattern) DO NOTHING

-- name: subscription_room
-- What the limits are checked against (core/limits.py): the patterns of one subscription
-- and the totals of the database, inside the transaction that just wrote them.
SELECT (SELECT count(*) FROM sqlbroker_subscription_pattern WHERE subscription = :name),
       (SELECT count(*) FROM sqlbroker_subscription),
       (SELECT count(*) FROM sqlbroker_subscription_pattern)

-- name: message_promote_scheduled
UPDATE sqlbroker_message SET state = 'available'
WHERE id IN (
    SELECT id FROM sqlbroker_message
    WHERE state = 'scheduled' AND subscription = :subscription AND available_at <= :now
    ORDER BY available_at
    LIMIT :limit
)

-- name: message_claim
WITH claim_ids AS (
    SELECT id FROM sqlbroker_message
    WHERE subscription = :subscription
      AND state = 'available'
      AND available_at <= :now
      AND (expires_at IS NULL OR expires_at > :now)
      -- A paused subscription claims nothing, and a flow-controlled one is claimed by
      -- message_claim_flow (flow.sql): one primary-key probe per claim.
      AND NOT EXISTS (SELECT 1 FROM sqlbroker_subscription s
                      WHERE s.name = :subscription
                        AND (s.paused OR s.max_running IS NOT NULL OR s.key_concurrency IS NOT NULL
                             OR s.rate_count IS NOT NULL OR s.key_rate_count IS NOT NULL OR s.fair))
    ORDER BY priority, available_at, id
    LIMIT :limit
)
-- include: message_claim_lease

-- name: message_claim_lease
-- The lease and attempt a claim gives each copy of its `claim_ids` (message_claim here,
-- message_claim_flow in flow.sql): one home for the rule on this dialect. A copy's lease
-- token is the claim's random :token and its id. No function call and OR FAIL (no
-- constraint can fail on these columns): either makes SQLite keep a statement journal of
-- every page the UPDATE changes, which past 64 KiB (a claim of 100: every one) spilled
-- into a temporary file created and removed in each claim. A failure still undoes the
-- whole claim (our transaction, or the savepoint in a caller's).
UPDATE OR FAIL sqlbroker_message
SET state = 'running',
    attempts = attempts + 1,
    lease_token = :token || '.' || id,
    lease_expires_at = :now + :lease,
    first_started_at = coalesce(first_started_at, :now),
    worker = :worker,
    max_attempts = coalesce(:max_attempts, max_attempts)
WHERE id IN (SELECT id FROM claim_ids)
RETURNING id, message_id, subscription, topic, payload, content_type, headers, priority,
          ordering_key, idempotency_key, attempts, max_attempts, replay_count, enqueued_at,
          available_at, expires_at, lease_token, lease_expires_at

-- name: key_promote
-- After a key's head left, the oldest blocked copy of the key becomes its head (unless a
-- head exists). The head is looked for once per key: tested for every blocked copy, as it
-- was, a promotion cost the square of the key's backlog (644 msg/s draining 12,000 keyed
-- messages against 3,930 for 3,000). The plan's pairs are distinct (no DISTINCT here), and
-- the block returns no rows: the promoted pairs matter only where publishers hold key
-- locks (PostgreSQL), and RETURNING cost a fifth of the statement (2,308 engine steps for
-- 10 keys against 1,778 without both).
UPDATE sqlbroker_message
SET state = CASE WHEN available_at > :now THEN 'scheduled' ELSE 'available' END
WHERE id IN (
    SELECT (SELECT b.id FROM sqlbroker_message b
            WHERE b.subscription = k.subscription AND b.ordering_key = k.ordering_key
              AND b.state = 'blocked'
            ORDER BY b.id
            LIMIT 1)
    FROM (SELECT js.value AS subscription, jk.value AS ordering_key
          FROM json_each(:subscriptions) js CROSS JOIN (SELECT key, value FROM json_each(:keys) LIMIT -1) jk ON jk.key = js.key) k
    WHERE NOT EXISTS (
        SELECT 1 FROM sqlbroker_message o
        WHERE o.subscription = k.subscription AND o.ordering_key = k.ordering_key
          AND o.ordering_key IS NOT NULL AND o.state <> 'blocked'
    )
)

-- name: key_repair
-- Keys left with blocked copies and no head (only possible after an interrupted
-- promotion) get their oldest blocked copy promoted.
UPDATE sqlbroker_message
SET state = CASE WHEN available_at > :now THEN 'scheduled' ELSE 'available' END
WHERE id IN (
    SELECT min(b.id) FROM sqlbroker_message b
    WHERE b.state = 'blocked'
    GROUP BY b.subscription, b.ordering_key
    -- Once per key, as in key_promote.
    HAVING NOT EXISTS (
        SELECT 1 FROM sqlbroker_message o
        WHERE o.subscription = b.subscription AND o.ordering_key = b.ordering_key
          AND o.ordering_key IS NOT NULL AND o.state <> 'blocked'
    )
    LIMIT :limit
)

-- name: message_retry
UPDATE sqlbroker_message
SET state = CASE WHEN b.after > 0 THEN 'scheduled' ELSE 'available' END,
    available_at = :now + b.after,
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL,
    attempts = sqlbroker_message.attempts - b.snooze,
    last_error = coalesce(b.last_error, sqlbroker_message.last_error),
    first_failed_at = CASE WHEN b.snooze THEN sqlbroker_message.first_failed_at
                           ELSE coalesce(sqlbroker_message.first_failed_at, :now) END,
    last_failed_at = CASE WHEN b.snooze THEN sqlbroker_message.last_failed_at ELSE :now END
FROM (SELECT i.value AS id, t.value AS token, a.value AS after, e.value AS last_error,
             s.value AS snooze
      FROM json_each(:ids) i
      CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:afters) LIMIT -1) a ON a.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:errors) LIMIT -1) e ON e.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:snoozes) LIMIT -1) s ON s.key = i.key) b
WHERE b.id = sqlbroker_message.id AND b.token = sqlbroker_message.lease_token
  AND sqlbroker_message.state = 'running'
RETURNING sqlbroker_message.id

-- name: message_extend
UPDATE sqlbroker_message
SET lease_expires_at = :now + :lease
FROM
-- include: leases_given
  AS l
WHERE sqlbroker_message.id = l.id AND sqlbroker_message.lease_token = l.token
  AND sqlbroker_message.state = 'running'
RETURNING sqlbroker_message.id, sqlbroker_message.lease_expires_at

-- name: message_release
UPDATE sqlbroker_message
SET state = 'available',
    attempts = max(attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL
FROM
-- include: leases_given
  AS l
WHERE sqlbroker_message.id = l.id AND sqlbroker_message.lease_token = l.token
  AND sqlbroker_message.state = 'running'
RETURNING sqlbroker_message.id

-- name: lease_expired_release
UPDATE sqlbroker_message
SET state = 'available',
    lease_token = NULL,
    lease_expires_at = NULL,
    worker = NULL,
    last_error = :last_error,
    first_failed_at = coalesce(first_failed_at, :now),
    last_failed_at = :now
WHERE id IN (
    SELECT id FROM sqlbroker_message
    WHERE state = 'running' AND lease_expires_at <= :now AND attempts < max_attempts
    ORDER BY lease_expires_at
    LIMIT :limit
)

-- name: dead_insert
-- (A fragment, included by message_dead and lease_expired_dead: the dead-letter table's
-- columns, in the order their SELECTs give them.)
INSERT INTO sqlbroker_dead (
    delivery_id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
    payload, content_type, headers, attempts, max_attempts, replay_count, reason, error_type,
    error_message, traceback, enqueued_at, first_started_at, first_failed_at, last_failed_at,
    dead_at
)

-- name: message_dead
-- Two statements (SQLite has no DML in a WITH): the valid leases' copies are copied to
-- the dead letters, then deleted, returning what promote_heads needs; both select the same
-- rows inside one write transaction.
-- include: dead_insert
SELECT m.id, m.message_id, m.subscription, m.topic, m.priority, m.ordering_key,
       m.idempotency_key, m.payload, m.content_type, m.headers, m.attempts, m.max_attempts,
       m.replay_count, b.reason, b.error_type, b.error_message, b.traceback, m.enqueued_at,
       m.first_started_at, coalesce(m.first_failed_at, :now), :now, :now
FROM sqlbroker_message m
JOIN (SELECT i.value AS id, t.value AS token, r.value AS reason, et.value AS error_type,
             em.value AS error_message, tb.value AS traceback
      FROM json_each(:ids) i
      CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:reasons) LIMIT -1) r ON r.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:error_types) LIMIT -1) et ON et.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:error_messages) LIMIT -1) em ON em.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:tracebacks) LIMIT -1) tb ON tb.key = i.key) b ON b.id = m.id AND b.token = m.lease_token
WHERE m.state = 'running'
ORDER BY m.id;
DELETE FROM sqlbroker_message
WHERE state = 'running' AND (id, lease_token) IN
-- include: leases_given
RETURNING id, subscription, ordering_key, state

-- name: leases_given
-- (A fragment: the (id, lease token) pairs given as the JSON arrays :ids and :tokens.)
(SELECT i.value AS id, t.value AS token FROM json_each(:ids) i
      CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key)

-- name: archive_copies
-- (A fragment, included by message_cancel, message_expire and lease_expired_cancelled,
-- each followed by its outcome.) Copies of sqlbroker_message into the archive, finished now.
INSERT INTO sqlbroker_archive (
    delivery_id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
    payload, content_type, headers, attempts, max_attempts, replay_count, enqueued_at,
    first_started_at, finished_at, outcome
)
SELECT id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
       payload, content_type, headers, attempts, max_attempts, replay_count, enqueued_at,
       first_started_at, :now,

-- name: message_cancel
-- Two statements, as in message_dead.
-- include: archive_copies
       'cancelled'
FROM sqlbroker_message
WHERE message_id IN (SELECT value FROM json_each(:message_ids)) AND state <> 'running'
ORDER BY id;
DELETE FROM sqlbroker_message
WHERE message_id IN (SELECT value FROM json_each(:message_ids)) AND state <> 'running'
RETURNING id, subscription, ordering_key, state

-- name: lease_expired_dead
-- Two statements, as in message_dead: copies whose lease expired on their last attempt.
-- include: dead_insert
SELECT id, message_id, subscription, topic, priority, ordering_key, idempotency_key,
       payload, content_type, headers, attempts, max_attempts, replay_count, :reason,
       :error_type, :error_message, NULL, enqueued_at, first_started_at,
       coalesce(first_failed_at, :now), :now, :now
FROM sqlbroker_message
WHERE id IN (SELECT id FROM sqlbroker_message
             WHERE state = 'running' AND lease_expires_at <= :now AND attempts >= max_attempts
             ORDER BY lease_expires_at, id
             LIMIT :limit)
ORDER BY id;
DELETE FROM sqlbroker_message
WHERE id IN (SELECT id FROM sqlbroker_message
             WHERE state = 'running' AND lease_expires_at <= :now AND attempts >= max_attempts
             ORDER BY lease_expires_at, id
             LIMIT :limit)
RETURNING id, subscription, ordering_key, state

-- name: message_expire
-- Two statements, as in message_dead: copies whose TTL passed.
-- include: archive_copies
       'expired'
FROM sqlbroker_message
WHERE id IN (SELECT id FROM sqlbroker_message
             WHERE expires_at <= :now AND state <> 'running'
             ORDER BY expires_at, id
             LIMIT :limit)
ORDER BY id;
DELETE FROM sqlbroker_message
WHERE id IN (SELECT id FROM sqlbroker_message
             WHERE expires_at <= :now AND state <> 'running'
             ORDER BY expires_at, id
             LIMIT :limit)
RETURNING id, subscription, ordering_key, state

-- name: leased_delete
-- (A fragment, included below.) The copies of the valid leases (:ids with :tokens) leave
-- the hot table, returning what promote_heads needs. The valid leases are one list of ids,
-- looked up by primary key, that SQLite builds once per statement (a row value
-- `(id, lease_token) IN (...)` built the pairing twice: a third of a complete's work).
DELETE FROM sqlbroker_message
WHERE state = 'running' AND id IN (SELECT m.id FROM json_each(:ids) i
       CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key
       JOIN sqlbroker_message m ON m.id = i.value AND m.lease_token = t.value
       WHERE m.state = 'running')
RETURNING id, subscription, ordering_key, state

-- name: leased_archive_completed
-- (A fragment, included below.) The copies of the valid leases, archived as completed.
-- OR FAIL: no constraint of the archive can fail on a copy's columns, and without the
-- default (ABORT) SQLite keeps no statement journal for this INSERT, which past 64 KiB (16
-- pages: an archive index split) spilled into a temporary file created per transaction
-- (the drain's complete of 10: one in five). A failure still undoes the whole operation
-- (our transaction, or the savepoint in a caller's).
INSERT OR FAIL INTO sqlbroker_archive (
    delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
    idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
    enqueued_at, first_started_at, finished_at
)
-- The copies are read from the pairing itself (in the leases' order), not looked up a
-- second time by a list of its ids in id order: 10 fewer engine steps a copy (of 176).
SELECT m.id, m.message_id, m.subscription, m.topic, 'completed', m.priority, m.ordering_key,
       m.idempotency_key, m.payload, m.content_type, m.headers, m.attempts, m.max_attempts,
       m.replay_count, m.enqueued_at, m.first_started_at, :now
FROM json_each(:ids) i
CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key
JOIN sqlbroker_message m ON m.id = i.value AND m.lease_token = t.value
WHERE m.state = 'running'

-- name: message_complete
-- Two statements: the copies of valid leases are archived, then read back from their
-- archive rows, returning what promote_heads needs (a copy that left was running); the plan
-- deletes them next by id (message_complete_delete). No RETURNING and one lease check:
-- with RETURNING SQLite cannot delete in one pass, and the two cost 40% of a complete. The
-- archive's ids are AUTOINCREMENT, so the rows of one INSERT are the consecutive ids ending
-- at last_insert_rowid(), changes() of them (none: an empty range, whatever row the
-- connection inserted last).
-- include: leased_archive_completed
;
SELECT delivery_id, subscription, ordering_key, 'running' FROM sqlbroker_archive
WHERE id > last_insert_rowid() - changes() AND id <= last_insert_rowid()
ORDER BY id

-- name: message_complete_delete
-- The copies message_complete (or message_complete_unarchived) found leave the hot table
-- (SQLite only: PostgreSQL's blocks delete them themselves). By a list of ids, with no function call: a function in a DELETE
-- of the hot table (which has a foreign key) makes SQLite keep a statement journal of every
-- page the DELETE changes, which past 64 KiB spills into a temporary file created and
-- removed in each transaction (the keyed drain: 13 of its writes and a file per complete).
DELETE FROM sqlbroker_message WHERE id IN (SELECT value FROM json_each(:ids))

-- name: message_complete_unarchived
-- message_complete for a backend with archive_completed=False: the copies of valid leases
-- are read, then deleted by the plan (message_complete_delete), not archived. Not one
-- DELETE ... RETURNING: with RETURNING SQLite cannot delete in one pass (113 engine steps a
-- copy against 60).
SELECT m.id, m.subscription, m.ordering_key, m.state
FROM json_each(:ids) i
CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key
JOIN sqlbroker_message m ON m.id = i.value AND m.lease_token = t.value
WHERE m.state = 'running'
ORDER BY m.id

-- name: message_complete_valued
-- message_complete for a batch in which some handler returned a value: the values (JSON
-- text, NULL: none) are stored as results first, then the copies are archived (when
-- :archive) and deleted.
INSERT INTO sqlbroker_result (delivery_id, message_id, subscription, value, finished_at)
SELECT m.id, m.message_id, m.subscription, CAST(v.value AS BLOB), :now
FROM sqlbroker_message m
JOIN (SELECT i.value AS id, t.value AS token, jv.value AS value
      FROM json_each(:ids) i
      CROSS JOIN (SELECT key, value FROM json_each(:tokens) LIMIT -1) t ON t.key = i.key
      CROSS JOIN (SELECT key, value FROM json_each(:values) LIMIT -1) jv ON jv.key = i.key) v ON v.id = m.id AND v.token = m.lease_token
WHERE m.state = 'running' AND v.value IS NOT NULL
ORDER BY m.id;
-- include: leased_archive_completed
  AND :archive;
-- include: leased_delete

-- name: subscription_delete
-- Publishing (operations/publishing.py) from here on. A batch is published one row at a
-- time (in-process, a statement costs no round trip): the ``_one`` blocks of PostgreSQL's,
-- with the same parameters and result columns.
DELETE FROM sqlbroker_message WHERE subscription = :name;
DELETE FROM sqlbroker_subscription WHERE name = :name

-- name: queue_create
-- The subscription of a queue, unless it exists; a row: it was created (its pattern next).
-- An existing queue (every single send's case) is found by its key before any row is
-- built: the insertion's defaults and checks of a subscription's columns cost three times
-- the engine steps of this lookup.
INSERT INTO sqlbroker_subscription (name, created_at)
SELECT :name, :now WHERE NOT EXISTS (SELECT 1 FROM sqlbroker_subscription WHERE name = :name)
ON CONFLICT (name) DO NOTHING
RETURNING name

-- name: dedupe_reserve_one
-- A row: the key is ours (new, or its holder's window ended).
INSERT INTO sqlbroker_dedupe (topic, idempotency_key, message_id, payload_hash, created_at, expires_at)
VALUES (:topic, :idempotency_key, :message_id, :payload_hash, :now, :now + :window)
ON CONFLICT (topic, idempotency_key) DO UPDATE
    SET message_id = excluded.message_id,
        payload_hash = excluded.payload_hash,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE sqlbroker_dedupe.expires_at <= :now
RETURNING topic, idempotency_key

-- name: dedupe_get_one
SELECT topic, idempotency_key, message_id, payload_hash FROM sqlbroker_dedupe
WHERE topic = :topic AND idempotency_key = :idempotency_key

-- name: message_routes
-- (A fragment, included below.) The routes (seq, subscription) of the messages m(seq,
-- topic): :subscription, or without it every subscription with a pattern that matches the
-- topic. Routing matches the stored pattern (sqlbroker_pattern_match validates it again: a
-- damaged row matches nothing), never the stored regex; cheap tests first, as in
-- PostgreSQL's message_insert_routing: a matching pattern's first segment is '*', '#' or
-- the topic's first word and a dot, its last segment '*', '#' or a dot and the last word.
SELECT m.seq, :subscription AS subscription FROM m WHERE :subscription IS NOT NULL
UNION ALL
SELECT DISTINCT m.seq, p.subscription
FROM m JOIN sqlbroker_subscription_pattern p ON CASE
    WHEN p.pattern = m.topic OR p.pattern = '#' THEN 1
    WHEN p.pattern = '*' THEN instr(m.topic, '.') = 0
    WHEN NOT (substr(p.pattern, 1, instr(m.topic || '.', '.'))
                = substr(m.topic || '.', 1, instr(m.topic || '.', '.'))
              OR substr(p.pattern, 1, 2) IN ('*.', '#.'))
        THEN 0
    WHEN NOT (substr(p.pattern, -1 - length(m.topic) + length(rtrim(m.topic, replace(m.topic, '.', ''))))
                = '.' || substr(m.topic, 1 + length(rtrim(m.topic, replace(m.topic, '.', ''))))
              OR substr(p.pattern, -2) IN ('.*', '.#'))
        THEN 0
    ELSE sqlbroker_pattern_match(p.pattern, m.topic)
END
WHERE :subscription IS NULL

-- name: message_copies
-- The copies a batch would make (message_routes), given its distinct :topics and how many
-- messages have each (:counts): a batch published one row at a time is counted first, so
-- that a refused fan-out writes nothing at all.
WITH m(seq, topic) AS (SELECT key, value FROM json_each(:topics)), r AS (
-- include: message_routes
)
SELECT coalesce(sum(c.value), 0) FROM r JOIN json_each(:counts) c ON c.key = r.seq

-- name: message_insert_one
-- One message: a copy for each of its routes, none past :max_copies copies (the caller
-- raises LimitExceeded from the count), and none routed: archived as unrouted. A copy
-- whose ordering key already has a copy in its subscription waits, blocked, behind it.
-- Returns (unrouted, notified, copies) as PostgreSQL's does. The routes are matched once
-- when the message was routed: the later statements look again only when no copy went in
-- (changes() is 0; the count is of the copies inserted, found by the message's new id).
WITH m(seq, topic) AS (SELECT 1, :topic), r AS (
-- include: message_routes
)
INSERT INTO sqlbroker_message (
    message_id, subscription, topic, state, priority, ordering_key, idempotency_key,
    payload, content_type, headers, max_attempts, enqueued_at, available_at, expires_at
)
SELECT :message_id, r.subscription, :topic,
       CASE WHEN :ordering_key IS NOT NULL AND EXISTS (
                SELECT 1 FROM sqlbroker_message o
                WHERE o.subscription = r.subscription AND o.ordering_key = :ordering_key
            ) THEN 'blocked'
            WHEN coalesce(:at, :now + coalesce(:delay, 0)) > :now THEN 'scheduled'
            ELSE 'available' END,
       :priority, :ordering_key, :idempotency_key, :payload, :content_type, :headers,
       :max_attempts, :now, coalesce(:at, :now + coalesce(:delay, 0)),
       coalesce(:expires, :now + :ttl)
FROM r
WHERE (SELECT count(*) FROM r) <= :max_copies;
WITH m(seq, topic) AS (SELECT 1, :topic), r AS (
-- include: message_routes
)
INSERT INTO sqlbroker_archive (
    delivery_id, message_id, subscription, topic, outcome, priority, ordering_key,
    idempotency_key, payload, content_type, headers, attempts, max_attempts, replay_count,
    enqueued_at, first_started_at, finished_at
)
SELECT NULL, :message_id, NULL, :topic, 'unrouted', :priority, :ordering_key,
       :idempotency_key, :payload, :content_type, :headers, 0, :max_attempts, 0,
       :now, NULL, :now
WHERE changes() = 0 AND NOT EXISTS (SELECT 1 FROM r);
WITH m(seq, topic) AS (SELECT 1, :topic), r AS (
-- include: message_routes
)
SELECT changes() AS unrouted, 0 AS notified,
       coalesce(nullif((SELECT count(*) FROM sqlbroker_message WHERE message_id = :message_id), 0),
                (SELECT count(*) FROM r)) AS copies

-- name: message_insert_queue_one
-- message_insert_one for a queue publish without ordering keys (the common case): one copy,
-- to :subscription (created before, by queue_create). Its rows are not read, so it returns
-- none: a batch runs it as one executemany.
INSERT INTO sqlbroker_message (
    message_id, subscription, topic, state, priority, idempotency_key, payload,
    content_type, headers, max_attempts, enqueued_at, available_at, expires_at
) VALUES (
    :message_id, :subscription, :topic,
    CASE WHEN coalesce(:at, :now + coalesce(:delay, 0)) > :now THEN 'scheduled'
         ELSE 'available' END,
    :priority, :idempotency_key, :payload, :content_type, :headers, :max_attempts, :now,
    coalesce(:at, :now + coalesce(:delay, 0)), coalesce(:expires, :now + :ttl)
)

-- name: message_insert_queue_known_one
-- message_insert_queue_one for a single send to a queue this process saw exist (SQLite
-- only: see KnownQueues), without queue_create first: the copy goes in only if the queue
-- is still there. Deleted since by another process, the insert writes nothing (rowcount
-- 0) and the plan creates the queue as on its first use.
INSERT INTO sqlbroker_message (
    message_id, subscription, topic, state, priority, idempotency_key, payload,
    content_type, headers, max_attempts, enqueued_at, available_at, expires_at
)
SELECT :message_id, :subscription, :topic,
       CASE WHEN coalesce(:at, :now + coalesce(:delay, 0)) > :now THEN 'scheduled'
            ELSE 'available' END,
       :priority, :idempotency_key, :payload, :content_type, :headers, :max_attempts, :now,
       coalesce(:at, :now + coalesce(:delay, 0)), coalesce(:expires, :now + :ttl)
FROM sqlbroker_subscription WHERE name = :subscription

-- name: message_insert_keyed_one
-- A queue publish of one message with an ordering key: message_insert_queue_one plus the
-- key's rule (the copy starts blocked when its key has a copy in the queue; the database
-- is locked, so no other writer runs in between). Same result columns as message_insert.
INSERT INTO sqlbroker_message (
    message_id, subscription, topic, state, priority, ordering_key, idempotency_key, payload,
    content_type, headers, max_attempts, enqueued_at, available_at, expires_at
) VALUES (
    :message_id, :subscription, :topic,
    CASE WHEN EXISTS (SELECT 1 FROM sqlbroker_message o
                      WHERE o.subscription = :subscription AND o.ordering_key = :ordering_key)
             THEN 'blocked'
         WHEN coalesce(:at, :now + coalesce(:delay, 0)) > :now THEN 'scheduled'
         ELSE 'available' END,
    :priority, :ordering_key, :idempotency_key, :payload, :content_type, :headers,
    :max_attempts, :now, coalesce(:at, :now + coalesce(:delay, 0)),
    coalesce(:expires, :now + :ttl)
)
RETURNING 0 AS unrouted, 0 AS notified, 1 AS copies

-- name: now
SELECT :now
