-- sqlbroker schema 15 (PostgreSQL): concurrency caps, rate limits and fairness
-- (docs/flow-control.md).
--
-- A subscription's flow settings are columns of it, NULL (false) when not set: at most
-- max_running copies running at once, at most key_concurrency running per ordering key,
-- rate_count claims per rate_period seconds (key_rate_*: per ordering key), and fair
-- (round-robin across ordering keys). All have constant defaults: no table is rewritten.
ALTER TABLE {schema}sqlbroker_subscription
    ADD COLUMN max_running integer CHECK (max_running > 0),
    ADD COLUMN key_concurrency integer CHECK (key_concurrency > 0),
    ADD COLUMN rate_count integer CHECK (rate_count > 0),
    ADD COLUMN rate_period double precision CHECK (rate_period > 0),
    ADD COLUMN key_rate_count integer CHECK (key_rate_count > 0),
    ADD COLUMN key_rate_period double precision CHECK (key_rate_period > 0),
    ADD COLUMN fair boolean NOT NULL DEFAULT false;

-- The rate limits' state (GCRA): the theoretical arrival time of the next claim of a
-- subscription (ordering_key '') or of one of its ordering keys (which are never empty).
-- A row whose time has passed means the same as no row, and claims delete them.
CREATE TABLE {schema}sqlbroker_flow_bucket (
    subscription text NOT NULL,
    ordering_key text NOT NULL,
    tat          timestamptz NOT NULL,
    PRIMARY KEY (subscription, ordering_key)
);

-- sqlbroker_flow_state(subscription): what a flow-controlled claim decides on, read after
-- it took the subscription's claim lock. The lock (held to the end of the claim's
-- transaction) serializes the claims of one flow-controlled subscription; the reads are
-- this function's own statements, so in READ COMMITTED they see every claim committed
-- before the lock was granted, which the claim statement's own snapshot (taken before it
-- waited) would not. One row per ordering key (NULL: copies without one) with its running
-- copies and its bucket time, and the subscription's bucket as ordering key ''.
CREATE FUNCTION {schema}sqlbroker_flow_state(claimed text)
RETURNS TABLE (ordering_key text, running bigint, tat timestamptz)
LANGUAGE plpgsql VOLATILE AS $flow$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(
        pg_catalog.hashtextextended('sqlbroker.flow:' || claimed, 5573));
    RETURN QUERY
    SELECT s.ordering_key, sum(s.running)::bigint, max(s.tat)
    FROM (
        SELECT m.ordering_key, 1 AS running, NULL::timestamptz AS tat
        FROM {schema}sqlbroker_message m
        WHERE m.subscription = claimed AND m.state = 'running'
        UNION ALL
        SELECT b.ordering_key, 0, b.tat
        FROM {schema}sqlbroker_flow_bucket b
        WHERE b.subscription = claimed
    ) s
    GROUP BY s.ordering_key;
END
$flow$;

-- Under tenant isolation (docs/security.md) a tenant's claims charge only the buckets of
-- the subscriptions it sees, as the Spark stream's rows (schema 9); with tenants already
-- enabled the table is isolated now, as `tenants enable` does.
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_flow_bucket
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s));

DO $enabled$
BEGIN
    IF (SELECT c.relrowsecurity FROM pg_catalog.pg_class c
        WHERE c.oid = '{schema}sqlbroker_message'::regclass) THEN
        ALTER TABLE {schema}sqlbroker_flow_bucket ENABLE ROW LEVEL SECURITY;
    END IF;
END
$enabled$;
