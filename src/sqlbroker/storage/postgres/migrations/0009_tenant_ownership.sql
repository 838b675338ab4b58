-- sqlbroker schema 9 (PostgreSQL): tenant ownership for every table a runtime role writes.
--
-- As in schema 7, nothing changes until `sqlbroker tenants enable` turns row-level security
-- on and sets the tenant column defaults. Three things change once it is on:
--
-- 1. A message belongs to its subscription, and only to it. Schema 7 let a row stay visible
--    through its own `tenant` column and let a tenant insert into a subscription that did
--    not exist yet, so a tenant could plant rows in another tenant's future queue, and keep
--    them after `tenants assign`. Now an insert needs a subscription that exists and is the
--    caller's tenant's, and the `tenant` column grants nothing on its own.
-- 2. Schedules, sagas and their steps, processed keys, worker heartbeats, the audit trail and
--    the Spark tables carry their tenant (or are reached through a subscription) and are
--    isolated like the queue. Keys a tenant chooses (schedule, processed key and worker
--    names) are per tenant, so one tenant can neither take nor collide with another's.
-- 3. Schedule times must be finite and decodable: one row with last_run_at = 'infinity' made
--    every scheduler's read of the due schedules fail.

-- sqlbroker_tenant_owns(subscription): does the subscription exist and belong to the
-- caller's tenant? It runs as the owner (to see every subscription) and is VOLATILE, so it
-- takes a fresh snapshot: it sees a queue created earlier in the calling statement (a send
-- that creates its queue) and one another tenant committed while the statement waited.
DO $tenant$
DECLARE
    ns text := (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class c
                WHERE c.oid = '{schema}sqlbroker_tenant'::regclass);
BEGIN
    EXECUTE format(
        'CREATE FUNCTION %s.sqlbroker_tenant_owns(subscription text) RETURNS boolean'
        ' LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp'
        ' AS %L',
        ns,
        format('BEGIN RETURN EXISTS (SELECT 1 FROM %1$s.sqlbroker_subscription s'
               ' WHERE s.name = subscription'
               ' AND s.tenant IS NOT DISTINCT FROM %1$s.sqlbroker_session_tenant()); END', ns));
END
$tenant$;

-- Messages: visible through a visible subscription. The second arm only serves the send
-- that creates its queue in the same statement (its RETURNING cannot see the new
-- subscription through the statement's snapshot); it needs the row's tenant AND a real
-- subscription of that tenant, so the column alone grants nothing. Inserts need both.
DROP POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_message;
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_message
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s)
           OR (tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant())
               AND {schema}sqlbroker_tenant_owns(subscription)));
DROP POLICY sqlbroker_tenant_insert ON {schema}sqlbroker_message;
CREATE POLICY sqlbroker_tenant_insert ON {schema}sqlbroker_message AS RESTRICTIVE FOR INSERT
    WITH CHECK (tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant())
                AND {schema}sqlbroker_tenant_owns(subscription));

-- Per-tenant keys: '' is no tenant (a key column cannot be NULL), as for idempotency keys.
ALTER TABLE {schema}sqlbroker_schedule ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE {schema}sqlbroker_schedule
    DROP CONSTRAINT sqlbroker_schedule_pkey,
    ADD CONSTRAINT sqlbroker_schedule_pkey PRIMARY KEY (name, tenant);
ALTER TABLE {schema}sqlbroker_processed ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE {schema}sqlbroker_processed
    DROP CONSTRAINT sqlbroker_processed_pkey,
    ADD CONSTRAINT sqlbroker_processed_pkey PRIMARY KEY (scope, key, tenant);
ALTER TABLE {schema}sqlbroker_worker ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE {schema}sqlbroker_worker
    DROP CONSTRAINT sqlbroker_worker_pkey,
    ADD CONSTRAINT sqlbroker_worker_pkey PRIMARY KEY (name, tenant);
-- Saga ids stay one namespace (steps reference them); a saga and the audit trail and the
-- Spark staging rows carry their tenant.
ALTER TABLE {schema}sqlbroker_saga ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE {schema}sqlbroker_audit ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE {schema}sqlbroker_spark_stage ADD COLUMN tenant text NOT NULL DEFAULT '';
-- A saga still moving keeps working for its tenant: it takes the tenant of the queue its
-- awaited message waits in. (Other rows written before this schema belong to no tenant.)
UPDATE {schema}sqlbroker_saga s SET tenant = coalesce(sub.tenant, '')
FROM {schema}sqlbroker_message m
JOIN {schema}sqlbroker_subscription sub ON sub.name = m.subscription
WHERE m.message_id = s.message_id AND s.status IN ('running', 'compensating');

-- Times a scheduler reads must decode: finite and inside what every client can represent.
-- NOT VALID: rows already stored are not checked, every new or changed row is.
ALTER TABLE {schema}sqlbroker_schedule ADD CONSTRAINT sqlbroker_schedule_times CHECK (
    next_run_at BETWEEN '0002-01-01 00:00+00' AND '9998-12-31 00:00+00'
    AND (last_run_at IS NULL OR last_run_at BETWEEN '0002-01-01 00:00+00' AND '9998-12-31 00:00+00')
    AND (start_at IS NULL OR start_at BETWEEN '0002-01-01 00:00+00' AND '9998-12-31 00:00+00')
    AND (anchor_at IS NULL OR anchor_at BETWEEN '0002-01-01 00:00+00' AND '9998-12-31 00:00+00')
    AND created_at BETWEEN '0002-01-01 00:00+00' AND '9998-12-31 00:00+00'
    AND updated_at BETWEEN '0002-01-01 00:00+00' AND '9998-12-31 00:00+00'
) NOT VALID;

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_schedule
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_processed
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_worker
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_saga
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));
-- A step is reached through its saga (looked up by key, not a list of every saga).
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_saga_step
    USING (EXISTS (SELECT 1 FROM {schema}sqlbroker_saga s WHERE s.id = saga_id));
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_audit
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_spark_stage
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_spark_stream
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s));
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_spark_claim
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s));

-- With tenants already enabled, the new tables are isolated now and their tenant columns
-- take the writer's tenant by default, as `tenants enable` does (security.sql): without
-- this, an upgraded deployment would leave them open (and refuse bound tenants' writes)
-- until someone ran `tenants enable` again.
DO $enabled$
BEGIN
    IF (SELECT c.relrowsecurity FROM pg_catalog.pg_class c
        WHERE c.oid = '{schema}sqlbroker_message'::regclass) THEN
        ALTER TABLE {schema}sqlbroker_schedule
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_processed
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_worker
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_saga
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_audit
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_spark_stage
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_schedule ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_processed ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_worker ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_saga ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_saga_step ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_audit ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_spark_stage ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_spark_stream ENABLE ROW LEVEL SECURITY;
        ALTER TABLE {schema}sqlbroker_spark_claim ENABLE ROW LEVEL SECURITY;
    END IF;
END
$enabled$;
