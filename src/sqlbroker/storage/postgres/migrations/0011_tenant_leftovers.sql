-- sqlbroker schema 11 (PostgreSQL): dead letters, archive rows and metrics carry their tenant.
--
-- Up to schema 10 these rows were reached through their subscription's name. `unsubscribe`
-- deletes the subscription and its queued messages but keeps its dead letters (audit), its
-- archive (until retention trims it) and its metrics, so a tenant that later created a
-- subscription of the same name read another tenant's leftovers. Now each row carries the
-- tenant that owned its subscription when it was written, and the policies compare that
-- tenant with the caller's, not the name: a new holder of the name sees none of them, and
-- the old tenant keeps its dead letters (to list, purge or replay) and its retention.
--
-- As before, nothing changes until `sqlbroker tenants enable` (below: or now, if enabled).

ALTER TABLE {schema}sqlbroker_dead ADD COLUMN tenant text;
-- Metric keys are per tenant ('' is no tenant, as for the other keys): two tenants' counters
-- of one name never collide, and a worker's upsert never meets a row it may not see.
ALTER TABLE {schema}sqlbroker_metric_minute ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE {schema}sqlbroker_metric_total ADD COLUMN tenant text NOT NULL DEFAULT '';

-- Rows already stored: a row written since its subscription was created belongs to the
-- subscription's tenant (as it did, through the name). A row older than its subscription
-- is a leftover of an earlier holder of the name: an archive row keeps the tenant it was
-- written with (the writer's, since schema 7); a dead letter or a minute belongs to no
-- tenant, and so to none of the tenants (the owner still sees it). Lifetime totals have no
-- time: those of a live name go to its holder.
UPDATE {schema}sqlbroker_dead d SET tenant = s.tenant
FROM {schema}sqlbroker_subscription s
WHERE s.name = d.subscription AND d.dead_at >= s.created_at;
UPDATE {schema}sqlbroker_archive a SET tenant = s.tenant
FROM {schema}sqlbroker_subscription s
WHERE s.name = a.subscription AND a.finished_at >= s.created_at
  AND a.tenant IS DISTINCT FROM s.tenant;
UPDATE {schema}sqlbroker_metric_minute m SET tenant = coalesce(s.tenant, '')
FROM {schema}sqlbroker_subscription s
WHERE s.name = m.subscription AND m.minute >= date_trunc('minute', s.created_at)
  AND s.tenant IS NOT NULL;
UPDATE {schema}sqlbroker_metric_total t SET tenant = coalesce(s.tenant, '')
FROM {schema}sqlbroker_subscription s
WHERE s.name = t.subscription AND s.tenant IS NOT NULL;

ALTER TABLE {schema}sqlbroker_metric_minute
    DROP CONSTRAINT sqlbroker_metric_minute_pkey,
    ADD CONSTRAINT sqlbroker_metric_minute_pkey PRIMARY KEY (subscription, minute, worker, tenant);
ALTER TABLE {schema}sqlbroker_metric_total
    DROP CONSTRAINT sqlbroker_metric_total_pkey,
    ADD CONSTRAINT sqlbroker_metric_total_pkey PRIMARY KEY (subscription, outcome, tenant);

-- The row's tenant alone decides: not the name, which another tenant may hold by now.
DROP POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_dead;
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_dead
    USING (tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant()));
DROP POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_archive;
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_archive
    USING (tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant()));
DROP POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_metric_minute;
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_metric_minute
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));
DROP POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_metric_total;
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_metric_total
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));

-- With tenants already enabled, the new columns take the writer's tenant by default now,
-- as `tenants enable` sets it (security.sql).
DO $enabled$
BEGIN
    IF (SELECT c.relrowsecurity FROM pg_catalog.pg_class c
        WHERE c.oid = '{schema}sqlbroker_message'::regclass) THEN
        ALTER TABLE {schema}sqlbroker_dead
            ALTER COLUMN tenant SET DEFAULT {schema}sqlbroker_session_tenant();
        ALTER TABLE {schema}sqlbroker_metric_minute
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_metric_total
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
    END IF;
END
$enabled$;
