-- sqlbroker schema 1 (SQLite). Times are REAL seconds since the Unix epoch, UTC.

CREATE TABLE sqlbroker_subscription (
    name        TEXT PRIMARY KEY,
    created_at  REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE sqlbroker_subscription_pattern (
    subscription TEXT NOT NULL REFERENCES sqlbroker_subscription (name) ON DELETE CASCADE,
    pattern      TEXT NOT NULL,
    regex        TEXT NOT NULL,
    PRIMARY KEY (subscription, pattern)
) WITHOUT ROWID;

-- The hot table: one row per live subscription copy. Finished copies leave it.
CREATE TABLE sqlbroker_message (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id       TEXT NOT NULL,
    subscription     TEXT NOT NULL,
    topic            TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('available', 'scheduled', 'blocked', 'running')),
    priority         INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 9),
    ordering_key     TEXT,
    idempotency_key  TEXT,
    payload          BLOB NOT NULL,
    content_type     TEXT NOT NULL,
    headers          TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    replay_count     INTEGER NOT NULL DEFAULT 0,
    enqueued_at      REAL NOT NULL,
    available_at     REAL NOT NULL,
    expires_at       REAL,
    first_started_at REAL,
    lease_token      TEXT,
    lease_expires_at REAL,
    worker           TEXT,
    last_error       TEXT,
    first_failed_at  REAL,
    last_failed_at   REAL
);

CREATE INDEX sqlbroker_message_claim ON sqlbroker_message (subscription, priority, available_at, id)
    WHERE state = 'available';
CREATE INDEX sqlbroker_message_scheduled ON sqlbroker_message (subscription, available_at)
    WHERE state = 'scheduled';
CREATE INDEX sqlbroker_message_lease ON sqlbroker_message (lease_expires_at)
    WHERE state = 'running';
CREATE INDEX sqlbroker_message_key ON sqlbroker_message (subscription, ordering_key, id)
    WHERE ordering_key IS NOT NULL;
CREATE INDEX sqlbroker_message_expiry ON sqlbroker_message (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX sqlbroker_message_message_id ON sqlbroker_message (message_id);

CREATE TABLE sqlbroker_archive (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id      INTEGER,
    message_id       TEXT NOT NULL,
    subscription     TEXT,
    topic            TEXT NOT NULL,
    outcome          TEXT NOT NULL CHECK (outcome IN ('completed', 'expired', 'cancelled', 'unrouted')),
    priority         INTEGER NOT NULL,
    ordering_key     TEXT,
    idempotency_key  TEXT,
    payload          BLOB NOT NULL,
    content_type     TEXT NOT NULL,
    headers          TEXT,
    attempts         INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    replay_count     INTEGER NOT NULL,
    enqueued_at      REAL NOT NULL,
    first_started_at REAL,
    finished_at      REAL NOT NULL
);
CREATE INDEX sqlbroker_archive_finished ON sqlbroker_archive (finished_at);
CREATE INDEX sqlbroker_archive_message_id ON sqlbroker_archive (message_id);

CREATE TABLE sqlbroker_dead (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id      INTEGER NOT NULL,
    message_id       TEXT NOT NULL,
    subscription     TEXT NOT NULL,
    topic            TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    ordering_key     TEXT,
    idempotency_key  TEXT,
    payload          BLOB NOT NULL,
    content_type     TEXT NOT NULL,
    headers          TEXT,
    attempts         INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    replay_count     INTEGER NOT NULL,
    reason           TEXT NOT NULL,
    error_type       TEXT,
    error_message    TEXT,
    traceback        TEXT,
    enqueued_at      REAL NOT NULL,
    first_started_at REAL,
    first_failed_at  REAL NOT NULL,
    last_failed_at   REAL NOT NULL,
    dead_at          REAL NOT NULL
);
CREATE INDEX sqlbroker_dead_subscription ON sqlbroker_dead (subscription, id);
CREATE INDEX sqlbroker_dead_at ON sqlbroker_dead (dead_at);

-- Idempotency keys outlive their messages: a key holds for its window, whatever happened
-- to the message since.
CREATE TABLE sqlbroker_dedupe (
    topic           TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    payload_hash    TEXT NOT NULL,
    created_at      REAL NOT NULL,
    expires_at      REAL NOT NULL,
    PRIMARY KEY (topic, idempotency_key)
) WITHOUT ROWID;
CREATE INDEX sqlbroker_dedupe_expires ON sqlbroker_dedupe (expires_at);

-- Who replayed or purged what, when and why (API, CLI and dashboard alike).
CREATE TABLE sqlbroker_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL NOT NULL,
    actor    TEXT NOT NULL,
    action   TEXT NOT NULL,
    detail   TEXT NOT NULL
);
