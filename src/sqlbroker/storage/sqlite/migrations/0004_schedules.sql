-- sqlbroker schema 4 (SQLite): durable schedules. Times are REAL seconds since the epoch.

CREATE TABLE sqlbroker_schedule (
    name            TEXT PRIMARY KEY,
    topic           TEXT NOT NULL,
    cron            TEXT,
    every_seconds   REAL,
    tz              TEXT NOT NULL,
    missed          TEXT NOT NULL CHECK (missed IN ('latest', 'skip', 'all')),
    grace_seconds   REAL NOT NULL,
    start_at        REAL,
    anchor_at       REAL,
    payload         BLOB NOT NULL,
    content_type    TEXT NOT NULL,
    headers         TEXT,
    priority        INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 9),
    ordering_key    TEXT,
    ttl_seconds     REAL,
    max_attempts    INTEGER NOT NULL,
    definition_hash TEXT NOT NULL,
    timing_hash     TEXT NOT NULL,
    next_run_at     REAL NOT NULL,
    last_run_at     REAL,
    last_message_id TEXT,
    paused          INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
) WITHOUT ROWID;

CREATE INDEX sqlbroker_schedule_due ON sqlbroker_schedule (next_run_at) WHERE paused = 0;
