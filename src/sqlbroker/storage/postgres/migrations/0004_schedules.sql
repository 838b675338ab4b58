-- sqlbroker schema 4 (PostgreSQL): durable schedules.

CREATE TABLE {schema}sqlbroker_schedule (
    name            text PRIMARY KEY,
    topic           text NOT NULL,
    cron            text,
    every_seconds   double precision,
    tz              text NOT NULL,
    missed          text NOT NULL CHECK (missed IN ('latest', 'skip', 'all')),
    grace_seconds   double precision NOT NULL,
    start_at        timestamptz,
    anchor_at       timestamptz,
    payload         bytea NOT NULL,
    content_type    text NOT NULL,
    headers         text,
    priority        smallint NOT NULL CHECK (priority BETWEEN 0 AND 9),
    ordering_key    text,
    ttl_seconds     double precision,
    max_attempts    integer NOT NULL,
    definition_hash text NOT NULL,
    timing_hash     text NOT NULL,
    next_run_at     timestamptz NOT NULL,
    last_run_at     timestamptz,
    last_message_id uuid,
    paused          boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);

CREATE INDEX sqlbroker_schedule_due ON {schema}sqlbroker_schedule (next_run_at) WHERE NOT paused;
