-- sqlbroker schema 8 (SQLite): an index of the heads of ordering keys (see the PostgreSQL
-- migration): "has this key a head?" is one probe, whatever the key's backlog.
CREATE INDEX sqlbroker_message_key_head ON sqlbroker_message (subscription, ordering_key)
    WHERE ordering_key IS NOT NULL AND state <> 'blocked';
