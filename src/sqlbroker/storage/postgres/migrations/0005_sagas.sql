-- Sagas: multi-step workflows with compensation. One row per saga instance and one per
-- step. Every transition happens in the transaction that acknowledges the message which
-- caused it (or in the sweeper's), so the rows are the single truth about a saga.
CREATE TABLE {schema}sqlbroker_saga (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    status      text NOT NULL CHECK (status IN
                    ('running', 'compensating', 'completed', 'compensated', 'failed')),
    data        jsonb NOT NULL,
    step        integer NOT NULL,
    version     integer NOT NULL,
    error       text,
    message_id  uuid,
    timeout     double precision NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    deadline    timestamptz,
    finished_at timestamptz
);
CREATE INDEX sqlbroker_saga_name ON {schema}sqlbroker_saga (name, created_at);
-- The sweeper's scan: only sagas still moving are indexed.
CREATE INDEX sqlbroker_saga_open ON {schema}sqlbroker_saga (deadline)
    WHERE status IN ('running', 'compensating');
CREATE TABLE {schema}sqlbroker_saga_step (
    saga_id        text NOT NULL REFERENCES {schema}sqlbroker_saga (id) ON DELETE CASCADE,
    idx            integer NOT NULL,
    name           text NOT NULL,
    compensate     boolean NOT NULL,
    status         text NOT NULL,
    attempts       integer NOT NULL DEFAULT 0,
    output         jsonb,
    error          text,
    started_at     timestamptz,
    finished_at    timestamptz,
    compensated_at timestamptz,
    PRIMARY KEY (saga_id, idx)
);
-- The sweeper asks whether the message a saga waits for was dead-lettered.
CREATE INDEX sqlbroker_dead_message_id ON {schema}sqlbroker_dead (message_id);
