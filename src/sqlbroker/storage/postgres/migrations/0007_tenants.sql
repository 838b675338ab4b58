-- sqlbroker schema 7 (PostgreSQL): optional tenants, isolated by row-level security.
--
-- Nothing here changes behaviour: the policies only bind once `sqlbroker tenants enable`
-- turns row-level security on (and sets the tenant column defaults). A tenant is bound to
-- the login role (session_user), which the tenant's own code cannot change, not to a setting.

-- Which login role belongs to which tenant. Each role sees only its own row.
CREATE TABLE {schema}sqlbroker_tenant (
    login_role text PRIMARY KEY,
    tenant     text NOT NULL CHECK (tenant ~ '^[A-Za-z0-9_-]{1,64}$')
);

-- A subscription (and with it its messages, dead letters, archive rows and metrics) belongs
-- to the tenant that created it; unrouted archive rows, which have no subscription, carry the
-- publisher's tenant themselves. NULL: no tenant.
ALTER TABLE {schema}sqlbroker_subscription ADD COLUMN tenant text;
ALTER TABLE {schema}sqlbroker_archive ADD COLUMN tenant text;

-- Idempotency keys are per tenant: two tenants using one key on one topic neither collide
-- nor learn of each other. '' is no tenant (a key column cannot be NULL).
ALTER TABLE {schema}sqlbroker_dedupe ADD COLUMN tenant text NOT NULL DEFAULT '';
ALTER TABLE {schema}sqlbroker_dedupe
    DROP CONSTRAINT sqlbroker_dedupe_pkey,
    ADD CONSTRAINT sqlbroker_dedupe_pkey PRIMARY KEY (topic, idempotency_key, tenant);
-- A message also carries its publisher's tenant: a send that creates its queue in the same
-- statement cannot see that queue yet, so the row must be recognisable as the tenant's own.
ALTER TABLE {schema}sqlbroker_message ADD COLUMN tenant text;

-- The calling login role's tenant. The body is bound to this schema (search_path is pinned),
-- so a temporary table named sqlbroker_tenant cannot stand in for the real one.
--
-- sqlbroker_tenant_may_use(subscription): may the caller put rows into this subscription?
-- Yes when it is the caller's tenant's, or does not exist yet (a send creating its queue).
-- It runs as the owner, to see every tenant's subscriptions, and is VOLATILE so that it
-- takes a fresh snapshot: a queue another tenant created and committed while this statement
-- waited on its insert is seen, and refused.
DO $tenant$
DECLARE
    ns text := (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class c
                WHERE c.oid = '{schema}sqlbroker_tenant'::regclass);
BEGIN
    -- PL/pgSQL keeps the plans of these bodies for the session; a plain SQL function would
    -- plan its body again in every statement that calls it.
    EXECUTE format(
        'CREATE FUNCTION %s.sqlbroker_session_tenant() RETURNS text LANGUAGE plpgsql STABLE'
        ' SET search_path = pg_catalog, pg_temp AS %L',
        ns,
        format('BEGIN RETURN (SELECT t.tenant FROM %s.sqlbroker_tenant t'
               ' WHERE t.login_role = session_user); END', ns));
    EXECUTE format(
        'CREATE FUNCTION %s.sqlbroker_tenant_may_use(subscription text) RETURNS boolean'
        ' LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp'
        ' AS %L',
        ns,
        format('BEGIN RETURN coalesce((SELECT s.tenant IS NOT DISTINCT FROM'
               ' %1$s.sqlbroker_session_tenant() FROM %1$s.sqlbroker_subscription s'
               ' WHERE s.name = subscription), true); END', ns));
END
$tenant$;

CREATE POLICY sqlbroker_tenant_own ON {schema}sqlbroker_tenant
    USING (login_role = session_user);

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_subscription
    USING (tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant()));

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_subscription_pattern
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s));
CREATE POLICY sqlbroker_tenant_new_queue ON {schema}sqlbroker_subscription_pattern FOR INSERT
    WITH CHECK ({schema}sqlbroker_tenant_may_use(subscription));

-- Claims filter on the visible subscriptions, computed once per statement (a hashed
-- subplan next to the claim index). Nobody but the owner may change a message's
-- subscription or tenant: the grants leave those two columns out of UPDATE.
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_message
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s)
           OR tenant = (SELECT {schema}sqlbroker_session_tenant()));
CREATE POLICY sqlbroker_tenant_insert ON {schema}sqlbroker_message AS RESTRICTIVE FOR INSERT
    WITH CHECK ({schema}sqlbroker_tenant_may_use(subscription));

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_dead
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s));

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_archive
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s)
           OR (subscription IS NULL
               AND tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant())));

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_dedupe
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_metric_minute
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s));

CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_metric_total
    USING (subscription IN (SELECT s.name FROM {schema}sqlbroker_subscription s));
