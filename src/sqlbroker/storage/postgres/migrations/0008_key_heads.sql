-- sqlbroker schema 8 (PostgreSQL): an index of the heads of ordering keys.
--
-- A key's promotion and repair ask "has this key a head?" (a copy not blocked). Without
-- this index PostgreSQL answered it with a scan of the whole hot table: 1 ms per keyed ack
-- with 12,000 copies waiting, growing with the backlog. It holds at most one row per key.
CREATE INDEX sqlbroker_message_key_head ON {schema}sqlbroker_message (subscription, ordering_key)
    WHERE ordering_key IS NOT NULL AND state <> 'blocked';
