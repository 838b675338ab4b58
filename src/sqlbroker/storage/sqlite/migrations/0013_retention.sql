-- sqlbroker schema 13 (SQLite): retention (docs/reliability.md, "Retention"). A
-- subscription may keep its archive rows and dead letters for a time of its own (seconds;
-- NULL: the broker's default). The reaper deletes rows past their time in bounded batches;
-- these indexes let it find a subscription's oldest rows without scanning the others'.
-- (PostgreSQL also partitions its archive by day; SQLite deletes rows.)

ALTER TABLE sqlbroker_subscription ADD COLUMN archive_retention REAL
    CHECK (archive_retention > 0 AND archive_retention <= 3153600000);
ALTER TABLE sqlbroker_subscription ADD COLUMN dead_retention REAL
    CHECK (dead_retention > 0 AND dead_retention <= 3153600000);
CREATE INDEX sqlbroker_archive_retention ON sqlbroker_archive (subscription, finished_at);
CREATE INDEX sqlbroker_dead_retention ON sqlbroker_dead (subscription, dead_at);
