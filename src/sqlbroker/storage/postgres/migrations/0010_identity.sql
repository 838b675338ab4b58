-- sqlbroker schema 10 (PostgreSQL): the database's identity, a random id written once, so
-- that two processes can tell whether they reached the same database: a Spark executor
-- checks it against its driver's before it writes or reads anything. The identity read
-- back also names the cluster and the database (spark.sql), so a database cloned from a
-- template or restored from a dump, which copies this row, is still another database.
CREATE TABLE {schema}sqlbroker_identity (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    database_id text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT statement_timestamp()
);
INSERT INTO {schema}sqlbroker_identity (database_id)
VALUES (md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text));
