-- Sagas: multi-step workflows with compensation. One row per saga instance and one per
-- step. Every transition happens in the transaction that acknowledges the message which
-- caused it (or in the sweeper's), so the rows are the single truth about a saga.
CREATE TABLE sqlbroker_saga (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN
                    ('running', 'compensating', 'completed', 'compensated', 'failed')),
    data        TEXT NOT NULL,
    step        INTEGER NOT NULL,
    version     INTEGER NOT NULL,
    error       TEXT,
    message_id  TEXT,
    timeout     REAL NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    deadline    REAL,
    finished_at REAL
);
CREATE INDEX sqlbroker_saga_name ON sqlbroker_saga (name, created_at);
-- The sweeper's scan: only sagas still moving are indexed.
CREATE INDEX sqlbroker_saga_open ON sqlbroker_saga (deadline)
    WHERE status IN ('running', 'compensating');
CREATE TABLE sqlbroker_saga_step (
    saga_id        TEXT NOT NULL REFERENCES sqlbroker_saga (id) ON DELETE CASCADE,
    idx            INTEGER NOT NULL,
    name           TEXT NOT NULL,
    compensate     INTEGER NOT NULL,
    status         TEXT NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    output         TEXT,
    error          TEXT,
    started_at     REAL,
    finished_at    REAL,
    compensated_at REAL,
    PRIMARY KEY (saga_id, idx)
) WITHOUT ROWID;
-- The sweeper asks whether the message a saga waits for was dead-lettered.
CREATE INDEX sqlbroker_dead_message_id ON sqlbroker_dead (message_id);
