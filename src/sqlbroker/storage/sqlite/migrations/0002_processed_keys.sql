-- Processed keys: a consumer's record of effects outside the database it has already
-- carried out (charged a card, sent an email), so a redelivered message skips them.
-- A key is first 'reserved' by one consumer for a lease, then 'done' until it expires.
CREATE TABLE sqlbroker_processed (
    scope          TEXT NOT NULL,
    key            TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('reserved', 'done')),
    token          TEXT NOT NULL,
    reserved_until REAL NOT NULL,
    created_at     REAL NOT NULL,
    done_at        REAL,
    expires_at     REAL NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX sqlbroker_processed_expires ON sqlbroker_processed (expires_at);
