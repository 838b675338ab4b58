-- sqlbroker schema 3 (PostgreSQL): worker heartbeats and the facts behind rates and latencies.

-- One row per worker process, refreshed by its heartbeat; stopped_at is set on a clean stop.
CREATE TABLE {schema}sqlbroker_worker (
    name          text PRIMARY KEY,
    host          text NOT NULL,
    pid           integer NOT NULL,
    subscriptions text NOT NULL,
    started_at    timestamptz NOT NULL,
    seen_at       timestamptz NOT NULL,
    stopped_at    timestamptz
);

-- What each worker did per subscription and minute. Only its own worker writes a row, with
-- absolute values, so writes never contend and a repeated write changes nothing.
CREATE TABLE {schema}sqlbroker_metric_minute (
    subscription    text NOT NULL,
    minute          timestamptz NOT NULL,
    worker          text NOT NULL,
    completed       bigint NOT NULL,
    retried         bigint NOT NULL,
    dead            bigint NOT NULL,
    handler_count   bigint NOT NULL,
    handler_seconds double precision NOT NULL,
    handler_buckets text NOT NULL,
    PRIMARY KEY (subscription, minute, worker)
);
CREATE INDEX sqlbroker_metric_minute_at ON {schema}sqlbroker_metric_minute (minute);

-- Lifetime outcome counters per subscription (monotonic, for Prometheus counters).
CREATE TABLE {schema}sqlbroker_metric_total (
    subscription text NOT NULL,
    outcome      text NOT NULL,
    count        bigint NOT NULL,
    PRIMARY KEY (subscription, outcome)
);

-- Expired and unrouted copies are rare: counting them must not scan the whole archive.
CREATE INDEX sqlbroker_archive_rare ON {schema}sqlbroker_archive (outcome, subscription, finished_at)
    WHERE outcome IN ('expired', 'unrouted');
