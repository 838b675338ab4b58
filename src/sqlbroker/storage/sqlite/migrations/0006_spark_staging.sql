-- sqlbroker schema 6 (SQLite): the tables of the Spark data source and archive pipeline.

-- Rows a Spark write task staged, tagged by job, partition and task attempt. The driver's
-- commit publishes the winning attempt of each partition and deletes the job's rows.
CREATE TABLE sqlbroker_spark_stage (
    job_id          TEXT NOT NULL,
    partition_id    INTEGER NOT NULL,
    attempt         INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    topic           TEXT NOT NULL,
    payload         BLOB NOT NULL,
    content_type    TEXT NOT NULL,
    headers         TEXT,
    priority        INTEGER NOT NULL,
    ordering_key    TEXT,
    idempotency_key TEXT,
    content_hash    TEXT NOT NULL,
    max_attempts    INTEGER NOT NULL,
    dedupe_window   REAL NOT NULL,
    staged_at       REAL NOT NULL,
    PRIMARY KEY (job_id, partition_id, attempt, seq)
);
CREATE INDEX sqlbroker_spark_stage_staged ON sqlbroker_spark_stage (staged_at);

-- One row per streaming source: the last claim sequence handed out and the last acked.
CREATE TABLE sqlbroker_spark_stream (
    name         TEXT PRIMARY KEY,
    subscription TEXT NOT NULL,
    last_seq     INTEGER NOT NULL DEFAULT 0,
    acked_seq    INTEGER NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL
) WITHOUT ROWID;

-- What each claim of a stream leased, copied at claim time, so that a batch replayed after
-- a restart reads exactly the same rows whatever happened to the leases since.
CREATE TABLE sqlbroker_spark_claim (
    stream          TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    delivery_id     INTEGER NOT NULL,
    lease_token     TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    subscription    TEXT NOT NULL,
    topic           TEXT NOT NULL,
    priority        INTEGER NOT NULL,
    ordering_key    TEXT,
    idempotency_key TEXT,
    payload         BLOB NOT NULL,
    content_type    TEXT NOT NULL,
    headers         TEXT,
    attempts        INTEGER NOT NULL,
    max_attempts    INTEGER NOT NULL,
    replay_count    INTEGER NOT NULL,
    enqueued_at     REAL NOT NULL,
    available_at    REAL NOT NULL,
    expires_at      REAL,
    first_started_at REAL,
    lease_expires_at REAL,
    last_error      TEXT,
    claimed_at      REAL NOT NULL,
    PRIMARY KEY (stream, seq, delivery_id)
);

-- Archive export runs whose delete committed (written in the delete's transaction).
CREATE TABLE sqlbroker_spark_export (
    run_id          TEXT PRIMARY KEY,
    cutoff          REAL NOT NULL,
    archive_max_id  INTEGER NOT NULL,
    dead_max_id     INTEGER NOT NULL,
    archive_rows    INTEGER NOT NULL,
    dead_rows       INTEGER NOT NULL,
    finished_at     REAL NOT NULL
) WITHOUT ROWID;
