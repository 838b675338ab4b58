-- sqlbroker schema 3 (SQLite): worker heartbeats and the facts behind rates and latencies.

-- One row per worker process, refreshed by its heartbeat; stopped_at is set on a clean stop.
CREATE TABLE sqlbroker_worker (
    name          TEXT PRIMARY KEY,
    host          TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    subscriptions TEXT NOT NULL,
    started_at    REAL NOT NULL,
    seen_at       REAL NOT NULL,
    stopped_at    REAL
) WITHOUT ROWID;

-- What each worker did per subscription and minute. Only its own worker writes a row, with
-- absolute values, so writes never contend and a repeated write changes nothing.
CREATE TABLE sqlbroker_metric_minute (
    subscription    TEXT NOT NULL,
    minute          REAL NOT NULL,
    worker          TEXT NOT NULL,
    completed       INTEGER NOT NULL,
    retried         INTEGER NOT NULL,
    dead            INTEGER NOT NULL,
    handler_count   INTEGER NOT NULL,
    handler_seconds REAL NOT NULL,
    handler_buckets TEXT NOT NULL,
    PRIMARY KEY (subscription, minute, worker)
) WITHOUT ROWID;
CREATE INDEX sqlbroker_metric_minute_at ON sqlbroker_metric_minute (minute);

-- Lifetime outcome counters per subscription (monotonic, for Prometheus counters).
CREATE TABLE sqlbroker_metric_total (
    subscription TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    count        INTEGER NOT NULL,
    PRIMARY KEY (subscription, outcome)
) WITHOUT ROWID;

-- Expired and unrouted copies are rare: counting them must not scan the whole archive.
CREATE INDEX sqlbroker_archive_rare ON sqlbroker_archive (outcome, subscription, finished_at)
    WHERE outcome IN ('expired', 'unrouted');
