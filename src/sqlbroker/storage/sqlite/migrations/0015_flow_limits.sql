-- sqlbroker schema 15 (SQLite): concurrency caps, rate limits and fairness
-- (docs/flow-control.md).
--
-- A subscription's flow settings are columns of it, NULL (0) when not set: at most
-- max_running copies running at once, at most key_concurrency running per ordering key,
-- rate_count claims per rate_period seconds (key_rate_*: per ordering key), and fair
-- (round-robin across ordering keys). SQLite's writers are serialized by BEGIN
-- IMMEDIATE, so a claim reads the running copies and buckets in its own transaction.
ALTER TABLE sqlbroker_subscription ADD COLUMN max_running INTEGER CHECK (max_running > 0);
ALTER TABLE sqlbroker_subscription ADD COLUMN key_concurrency INTEGER CHECK (key_concurrency > 0);
ALTER TABLE sqlbroker_subscription ADD COLUMN rate_count INTEGER CHECK (rate_count > 0);
ALTER TABLE sqlbroker_subscription ADD COLUMN rate_period REAL CHECK (rate_period > 0);
ALTER TABLE sqlbroker_subscription ADD COLUMN key_rate_count INTEGER CHECK (key_rate_count > 0);
ALTER TABLE sqlbroker_subscription ADD COLUMN key_rate_period REAL CHECK (key_rate_period > 0);
ALTER TABLE sqlbroker_subscription ADD COLUMN fair INTEGER NOT NULL DEFAULT 0;

-- The rate limits' state (GCRA): the theoretical arrival time (Unix seconds) of the next
-- claim of a subscription (ordering_key '') or of one of its ordering keys (never empty).
-- A row whose time has passed means the same as no row, and claims delete them.
CREATE TABLE sqlbroker_flow_bucket (
    subscription TEXT NOT NULL,
    ordering_key TEXT NOT NULL,
    tat          REAL NOT NULL,
    PRIMARY KEY (subscription, ordering_key)
) WITHOUT ROWID;
