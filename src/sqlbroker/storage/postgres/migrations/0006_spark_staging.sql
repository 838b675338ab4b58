-- sqlbroker schema 6 (PostgreSQL): the tables of the Spark data source and archive pipeline.

-- Rows a Spark write task staged, tagged by job, partition and task attempt. The driver's
-- commit publishes the winning attempt of each partition and deletes the job's rows.
CREATE TABLE {schema}sqlbroker_spark_stage (
    job_id          text NOT NULL,
    partition_id    integer NOT NULL,
    attempt         bigint NOT NULL,
    seq             integer NOT NULL,
    topic           text NOT NULL,
    payload         bytea NOT NULL,
    content_type    text NOT NULL,
    headers         text,
    priority        smallint NOT NULL,
    ordering_key    text,
    idempotency_key text,
    content_hash    text NOT NULL,
    max_attempts    integer NOT NULL,
    dedupe_window   double precision NOT NULL,
    staged_at       timestamptz NOT NULL,
    PRIMARY KEY (job_id, partition_id, attempt, seq)
);
CREATE INDEX sqlbroker_spark_stage_staged ON {schema}sqlbroker_spark_stage (staged_at);

-- One row per streaming source: the last claim sequence handed out and the last acked.
CREATE TABLE {schema}sqlbroker_spark_stream (
    name         text PRIMARY KEY,
    subscription text NOT NULL,
    last_seq     bigint NOT NULL DEFAULT 0,
    acked_seq    bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL
);

-- What each claim of a stream leased, copied at claim time, so that a batch replayed after
-- a restart reads exactly the same rows whatever happened to the leases since.
CREATE TABLE {schema}sqlbroker_spark_claim (
    stream          text NOT NULL,
    seq             bigint NOT NULL,
    delivery_id     bigint NOT NULL,
    lease_token     uuid NOT NULL,
    message_id      uuid NOT NULL,
    subscription    text NOT NULL,
    topic           text NOT NULL,
    priority        smallint NOT NULL,
    ordering_key    text,
    idempotency_key text,
    payload         bytea NOT NULL,
    content_type    text NOT NULL,
    headers         text,
    attempts        integer NOT NULL,
    max_attempts    integer NOT NULL,
    replay_count    integer NOT NULL,
    enqueued_at     timestamptz NOT NULL,
    available_at    timestamptz NOT NULL,
    expires_at      timestamptz,
    first_started_at timestamptz,
    lease_expires_at timestamptz,
    last_error      text,
    claimed_at      timestamptz NOT NULL,
    PRIMARY KEY (stream, seq, delivery_id)
);

-- Archive export runs whose delete committed (written in the delete's transaction).
CREATE TABLE {schema}sqlbroker_spark_export (
    run_id          text PRIMARY KEY,
    cutoff          timestamptz NOT NULL,
    archive_max_id  bigint NOT NULL,
    dead_max_id     bigint NOT NULL,
    archive_rows    bigint NOT NULL,
    dead_rows       bigint NOT NULL,
    finished_at     timestamptz NOT NULL
);
