-- sqlbroker schema 17 (SQLite): an index of the claimable heads of ordering keys, in claim
-- order (see the PostgreSQL migration): a fair or key-limited claim walks the keyed copies
-- through it instead of ranking the whole backlog.
CREATE INDEX sqlbroker_message_key_claim ON sqlbroker_message (subscription, priority, available_at, id)
    WHERE state = 'available' AND ordering_key IS NOT NULL;
