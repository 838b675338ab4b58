-- sqlbroker schema 17 (PostgreSQL): an index of the claimable heads of ordering keys, in
-- claim order.
--
-- A fair or key-limited claim (message_claim_flow) walks the keys whose copies it may take
-- in claim order instead of ranking the whole backlog. The claim index serves the walk
-- over every available copy; this one serves the walk over the keyed ones, so that a long
-- run of copies without a key does not hide the keys behind it. It holds the available
-- copies that have a key: at most one per key unless key_concurrency lets a key run more.
CREATE INDEX sqlbroker_message_key_claim
    ON {schema}sqlbroker_message (subscription, priority, available_at, id)
    WHERE state = 'available' AND ordering_key IS NOT NULL;
