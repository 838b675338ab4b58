-- Processed keys: a consumer's record of effects outside the database it has already
-- carried out (charged a card, sent an email), so a redelivered message skips them.
-- A key is first 'reserved' by one consumer for a lease, then 'done' until it expires.
CREATE TABLE {schema}sqlbroker_processed (
    scope          text NOT NULL,
    key            text NOT NULL,
    state          text NOT NULL CHECK (state IN ('reserved', 'done')),
    token          uuid NOT NULL,
    reserved_until timestamptz NOT NULL,
    created_at     timestamptz NOT NULL,
    done_at        timestamptz,
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX sqlbroker_processed_expires ON {schema}sqlbroker_processed (expires_at);
