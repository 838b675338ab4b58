-- Least privilege and tenants (PostgreSQL). Role and schema names never become part of the
-- statement text: they travel as bound parameters into settings, and the
-- DO blocks below quote them with format('%I') when they build a GRANT.

-- name: security_settings
-- The grant block's arguments, for the transaction (roles_grant is atomic): local, so
-- nothing is left on the session, and behind a transaction pooler the grant, the next
-- statement of the same transaction, runs on the same server session.
SELECT set_config('sqlbroker.role_prefix', %(prefix)s::text, true),
       set_config('sqlbroker.grant_schema', coalesce(%(schema)s::text, current_schema()), true),
       set_config('sqlbroker.create_roles', %(create)s::text, true)

-- name: roles_grant
-- The grant matrix: for each group role, the privileges it gets on each sqlbroker table.
-- Every table of the schema must appear here for the reader at least (a test checks it),
-- so a migration that adds a table cannot silently leave a role without access. The whole
-- block runs in one transaction: privileges are first revoked, then granted again, so the
-- result is exactly this matrix however often it runs. It reads its arguments from the
-- settings security_settings wrote just before, in the same transaction. The plan checks
-- the group roles first; the check here only catches a role dropped meanwhile.
--
-- The matrix, a row per table: what each group may do there, S(ELECT), I(NSERT),
-- U(PDATE), D(ELETE) ('': nothing).
-- The producer publishes, sends (creating the queue), writes the outbox, idempotency keys,
-- sagas.start and Spark's staged writes, and reads and saves Celery's results (groups
-- and chords). The consumer claims, acks, retries, dead-letters, extends, reaps
-- (deleting dead letters past their retention, schema 13), subscribes, registers and
-- ticks schedules, moves sagas, keeps processed keys, heartbeats and metrics, runs the
-- Spark stream and charges the flow limits' rate buckets (schema 15); schedules and
-- sagas publish, so it also holds the producer's rights on the queue. The operator runs
-- the dashboard's and CLI's actions: dead-letter replay and purge (audited), cancel,
-- subscription and schedule administration, the archive export (which deletes what it
-- exported). The reader reads every table (every read view: dashboard, metrics, CLI)
-- and writes nothing. Every runtime role reads the schema version, the database's
-- identity (Spark's tasks compare it with their driver's) and the tenants.
DO $grant$
DECLARE
    prefix text := current_setting('sqlbroker.role_prefix', true);
    target text := current_setting('sqlbroker.grant_schema', true);
    create_roles boolean := coalesce(nullif(current_setting('sqlbroker.create_roles', true), ''), 'off')::boolean;
    groups text[] := ARRAY['migrator', 'producer', 'consumer', 'reader', 'operator'];
    runtime text[] := ARRAY['producer', 'consumer', 'reader', 'operator'];
    group_name text;
    entry record;
    tables text[];
BEGIN
    IF coalesce(prefix, '') = '' THEN
        RAISE EXCEPTION 'sqlbroker: roles_grant runs after security_settings, on its connection';
    END IF;
    FOREACH group_name IN ARRAY groups LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = prefix || '_' || group_name) THEN
            IF NOT create_roles THEN
                RAISE EXCEPTION 'sqlbroker: the role %% does not exist', prefix || '_' || group_name
                    USING ERRCODE = 'undefined_object',
                          HINT = 'create the group roles first, or grant with --create as a role allowed to create roles';
            END IF;
            EXECUTE format('CREATE ROLE %%I NOLOGIN', prefix || '_' || group_name);
        END IF;
    END LOOP;

    SELECT array_agg(c.relname::text ORDER BY c.relname) INTO tables
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = target AND c.relkind IN ('r', 'p') AND NOT c.relispartition
      AND c.relname LIKE 'sqlbroker\_%%';
    IF tables IS NULL THEN
        RAISE EXCEPTION 'sqlbroker: no sqlbroker tables in schema %%', target
            USING ERRCODE = 'undefined_table', HINT = 'run sqlbroker migrate first';
    END IF;

    FOREACH group_name IN ARRAY runtime LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA %%I TO %%I', target, prefix || '_' || group_name);
        EXECUTE format('REVOKE ALL ON TABLE %%s FROM %%I',
                       (SELECT string_agg(format('%%I.%%I', target, t), ', ') FROM unnest(tables) t),
                       prefix || '_' || group_name);
    END LOOP;

    FOR entry IN
        SELECT g.table_name, r.role_suffix,
               concat_ws(', ', CASE WHEN strpos(r.letters, 'S') > 0 THEN 'SELECT' END,
                               CASE WHEN strpos(r.letters, 'I') > 0 THEN 'INSERT' END,
                               CASE WHEN strpos(r.letters, 'U') > 0 THEN 'UPDATE' END,
                               CASE WHEN strpos(r.letters, 'D') > 0 THEN 'DELETE' END) AS privileges
        FROM (VALUES
            -- table                           producer consumer operator reader
            ('sqlbroker_schema_version',       'S',     'S',     'S',     'S'),
            ('sqlbroker_identity',             'S',     'S',     'S',     'S'),
            ('sqlbroker_tenant',               'S',     'S',     'S',     'S'),
            ('sqlbroker_subscription',         'SI',    'SI',    'SID',   'S'),
            ('sqlbroker_subscription_pattern', 'SI',    'SID',   'SID',   'S'),
            ('sqlbroker_message',              'SI',    'SID',   'SID',   'S'),
            ('sqlbroker_archive',              'I',     'SID',   'SID',   'S'),
            ('sqlbroker_dead',                 '',      'SID',   'SUD',   'S'),
            ('sqlbroker_result',               '',      'SID',   'SD',    'S'),
            ('sqlbroker_task_result',          'SIUD',  'SIUD',  'SD',    'S'),
            ('sqlbroker_dedupe',               'SIU',   'SIUD',  '',      'S'),
            ('sqlbroker_processed',            '',      'SIUD',  '',      'S'),
            ('sqlbroker_worker',               '',      'SIUD',  '',      'S'),
            ('sqlbroker_metric_minute',        '',      'SIUD',  '',      'S'),
            ('sqlbroker_metric_total',         '',      'SIU',   '',      'S'),
            ('sqlbroker_schedule',             '',      'SIU',   'SIUD',  'S'),
            ('sqlbroker_saga',                 'SIU',   'SIU',   '',      'S'),
            ('sqlbroker_saga_step',            'SIU',   'SIU',   '',      'S'),
            ('sqlbroker_audit',                '',      '',      'SI',    'S'),
            ('sqlbroker_flow_bucket',          '',      'SIUD',  'SIUD',  'S'),
            ('sqlbroker_spark_stage',          'SID',   '',      '',      'S'),
            ('sqlbroker_spark_stream',         '',      'SIU',   '',      'S'),
            ('sqlbroker_spark_claim',          '',      'SIUD',  '',      'S'),
            ('sqlbroker_spark_export',         '',      '',      'SI',    'S')
        ) AS g(table_name, producer, consumer, operator, reader)
        CROSS JOIN LATERAL (VALUES ('producer', g.producer), ('consumer', g.consumer),
                                   ('operator', g.operator), ('reader', g.reader))
            AS r(role_suffix, letters)
        WHERE g.table_name = ANY (tables) AND r.letters <> ''
    LOOP
        EXECUTE format('GRANT %%s ON TABLE %%I.%%I TO %%I',
                       entry.privileges, target, entry.table_name, prefix || '_' || entry.role_suffix);
    END LOOP;

    -- The archive's partitions are reached through it; its ids come from a sequence and its
    -- days are created and dropped by a function that runs as the owner (schema 13): those
    -- who insert use the sequence, those who delete (the reaper, the export) maintain days.
    IF to_regclass(format('%%I.sqlbroker_archive_id_seq', target)) IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SEQUENCE %%I.sqlbroker_archive_id_seq TO %%I, %%I, %%I',
                       target, prefix || '_producer', prefix || '_consumer', prefix || '_operator');
        EXECUTE format('GRANT EXECUTE ON FUNCTION %%I.sqlbroker_archive_maintain(timestamptz,'
                       ' integer, timestamptz) TO %%I, %%I',
                       target, prefix || '_consumer', prefix || '_operator');
        -- The operator sets a subscription's retention (and nothing else of it).
        EXECUTE format('GRANT UPDATE (archive_retention, dead_retention)'
                       ' ON TABLE %%I.sqlbroker_subscription TO %%I', target, prefix || '_operator');
    END IF;

    -- Consumers and operators update messages (claim, ack, retry, release, promote) but
    -- never move one to another subscription or tenant: UPDATE on every other column.
    FOREACH group_name IN ARRAY ARRAY['consumer', 'operator'] LOOP
        EXECUTE format('GRANT UPDATE (%%s) ON TABLE %%I.sqlbroker_message TO %%I',
                       (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
                        FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid = format('%%I.sqlbroker_message', target)::regclass
                          AND a.attnum > 0 AND NOT a.attisdropped
                          AND a.attname NOT IN ('id', 'message_id', 'subscription', 'topic', 'tenant')),
                       target, prefix || '_' || group_name);
    END LOOP;
    -- Operators pause and resume subscriptions (docs/flow-control.md): that column only.
    EXECUTE format('GRANT UPDATE (paused) ON TABLE %%I.sqlbroker_subscription TO %%I',
                   target, prefix || '_operator');
    -- Operators set a subscription's flow limits, and so do workers (subscriber(max_running=…)
    -- declares them): those columns only (schema 15).
    IF to_regclass(format('%%I.sqlbroker_flow_bucket', target)) IS NOT NULL THEN
        EXECUTE format('GRANT UPDATE (max_running, key_concurrency, rate_count, rate_period,'
                       ' key_rate_count, key_rate_period, fair)'
                       ' ON TABLE %%I.sqlbroker_subscription TO %%I, %%I',
                       target, prefix || '_operator', prefix || '_consumer');
    END IF;
END
$grant$

-- name: roles_missing
-- The group roles <prefix>_<group> that do not exist, in the order of %(groups)s.
SELECT g.name
FROM unnest(%(groups)s::text[]) WITH ORDINALITY AS g(name, position)
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = g.name)
ORDER BY g.position

-- name: roles_table_grants
-- What the grant matrix gave each group role, per table (for tests and `roles show`).
SELECT r.rolname::text AS role, c.relname::text AS table_name,
       string_agg(p.privilege_type, ', ' ORDER BY p.privilege_type) AS privileges
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(c.relacl) AS p
JOIN pg_catalog.pg_roles r ON r.oid = p.grantee
-- include: sqlbroker_tables
  AND r.rolname LIKE %(prefix)s::text || '\_%%'
GROUP BY r.rolname, c.relname
ORDER BY r.rolname, c.relname

-- name: sqlbroker_tables
-- (A fragment: c is a table of sqlbroker's in the schema n, %(schema)s or the current one.)
WHERE n.nspname = coalesce(%(schema)s::text, current_schema())
  AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname LIKE 'sqlbroker\_%%'

-- name: roles_tables
SELECT c.relname::text
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
-- include: sqlbroker_tables
ORDER BY 1

-- name: tenants_enable
-- One statement (a DO block) each way, with the body tenants_switch: the tenant columns
-- take the session's tenant by default (those that are part of a key: '' for none) and
-- row-level security is turned on; or the defaults go and it is turned off. (A table a
-- schema older than this code lacks, flow_bucket of schema 15, is passed over.)
DO $tenants$
DECLARE
    enabled constant boolean := true;
-- include: tenants_switch
$tenants$

-- name: tenants_disable
DO $tenants$
DECLARE
    enabled constant boolean := false;
-- include: tenants_switch
$tenants$

-- name: tenants_switch
    suffix text;
BEGIN
    FOREACH suffix IN ARRAY ARRAY['subscription', 'archive', 'dead', 'result', 'message'] LOOP
        EXECUTE format('ALTER TABLE {schema}%%I ALTER COLUMN tenant %%s', 'sqlbroker_' || suffix,
                       CASE WHEN enabled THEN 'SET DEFAULT {schema}sqlbroker_session_tenant()'
                            ELSE 'DROP DEFAULT' END);
    END LOOP;
    FOREACH suffix IN ARRAY ARRAY['metric_minute', 'metric_total', 'dedupe', 'schedule',
                                  'processed', 'task_result', 'worker', 'saga', 'audit',
                                  'spark_stage'] LOOP
        EXECUTE format('ALTER TABLE {schema}%%I ALTER COLUMN tenant SET DEFAULT %%s',
                       'sqlbroker_' || suffix,
                       CASE WHEN enabled THEN 'coalesce({schema}sqlbroker_session_tenant(), '''')'
                            ELSE '''''' END);
    END LOOP;
    FOREACH suffix IN ARRAY ARRAY['tenant', 'subscription', 'subscription_pattern', 'message',
                                  'dead', 'result', 'archive', 'dedupe', 'metric_minute',
                                  'metric_total', 'schedule', 'processed', 'task_result',
                                  'worker', 'saga', 'saga_step', 'audit', 'spark_stage',
                                  'spark_stream', 'spark_claim', 'flow_bucket'] LOOP
        IF to_regclass('{schema}' || quote_ident('sqlbroker_' || suffix)) IS NOT NULL THEN
            EXECUTE format('ALTER TABLE {schema}%%I %%s ROW LEVEL SECURITY', 'sqlbroker_' || suffix,
                           CASE WHEN enabled THEN 'ENABLE' ELSE 'DISABLE' END);
        END IF;
    END LOOP;
END

-- name: tenants_enabled
SELECT relrowsecurity FROM pg_catalog.pg_class WHERE oid = to_regclass('{schema}sqlbroker_message')

-- name: tenant_role_exists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %(role)s::text)

-- name: tenant_set
INSERT INTO {schema}sqlbroker_tenant (login_role, tenant) VALUES (%(role)s, %(tenant)s)
ON CONFLICT (login_role) DO UPDATE SET tenant = excluded.tenant

-- name: tenant_remove
DELETE FROM {schema}sqlbroker_tenant WHERE login_role = %(role)s

-- name: tenant_list
SELECT login_role, tenant FROM {schema}sqlbroker_tenant ORDER BY tenant, login_role

-- name: tenant_assign
-- The subscription moves with everything it holds: its messages, and the dead letters,
-- archive rows, stored results and metrics of its current tenant (schema 11: those rows
-- carry their tenant), and the Celery results (schema 16) of the Celery tasks it holds:
-- their task results, and the group results and chord counters of their groups (see
-- celery_keys). Rows that an earlier holder of the name left behind stay that holder's.
WITH old AS (
    SELECT name, tenant FROM {schema}sqlbroker_subscription
    WHERE name = %(subscription)s
    FOR UPDATE
),
moved AS (
    UPDATE {schema}sqlbroker_subscription s SET tenant = %(tenant)s::text
    FROM old WHERE s.name = old.name
    RETURNING s.name
),
messages AS (
    UPDATE {schema}sqlbroker_message SET tenant = %(tenant)s::text
    WHERE subscription IN (SELECT name FROM moved)
),
dead AS (
    UPDATE {schema}sqlbroker_dead d SET tenant = %(tenant)s::text
    FROM old WHERE d.subscription = old.name AND d.tenant IS NOT DISTINCT FROM old.tenant
),
archived AS (
    UPDATE {schema}sqlbroker_archive a SET tenant = %(tenant)s::text
    FROM old WHERE a.subscription = old.name AND a.tenant IS NOT DISTINCT FROM old.tenant
),
results AS (
    UPDATE {schema}sqlbroker_result r SET tenant = %(tenant)s::text
    FROM old WHERE r.subscription = old.name AND r.tenant IS NOT DISTINCT FROM old.tenant
),
-- Celery's results are keyed by task or group id, not by queue: the ids are those of the
-- Celery tasks (Kombu messages, labelled "celery-task" by contrib/celery) the subscription
-- holds under its current tenant, ready, archived or dead, and of their groups (a chord's
-- header is a group): a task's result, its group's result and its chord's counter (Celery's
-- keys, after any global key prefix). A group whose tasks went to several subscriptions
-- moves with the first of them handed over. A result the new tenant already has under the
-- same key stays the old tenant's.
celery_tasks AS (
    SELECT convert_from(t.payload, 'UTF8')::jsonb -> 'headers' AS headers
    FROM (
        SELECT m.payload, m.content_type, m.headers FROM {schema}sqlbroker_message m, old
        WHERE m.subscription = old.name
        UNION ALL
        SELECT a.payload, a.content_type, a.headers FROM {schema}sqlbroker_archive a, old
        WHERE a.subscription = old.name AND a.tenant IS NOT DISTINCT FROM old.tenant
        UNION ALL
        SELECT d.payload, d.content_type, d.headers FROM {schema}sqlbroker_dead d, old
        WHERE d.subscription = old.name AND d.tenant IS NOT DISTINCT FROM old.tenant
    ) t
    WHERE t.content_type = 'application/json' AND strpos(t.headers, '"celery-task"') > 0
),
celery_keys AS (
    SELECT 'celery-task-meta-' || (headers ->> 'id') AS key FROM celery_tasks
    UNION
    SELECT 'celery-taskset-meta-' || (headers ->> 'group') FROM celery_tasks
    UNION
    SELECT 'chord-unlock-' || (headers ->> 'group') FROM celery_tasks
),
task_results AS (
    UPDATE {schema}sqlbroker_task_result r SET tenant = coalesce(%(tenant)s::text, '')
    FROM old, celery_keys c
    WHERE r.tenant = coalesce(old.tenant, '')
      AND coalesce(old.tenant, '') <> coalesce(%(tenant)s::text, '')
      AND substring(r.key FROM '(?:celery-task-meta-|celery-taskset-meta-|chord-unlock-).*$')
          = c.key
      AND NOT EXISTS (
          SELECT 1 FROM {schema}sqlbroker_task_result n
          WHERE n.key = r.key AND n.tenant = coalesce(%(tenant)s::text, '')
      )
),
-- Metric keys include the tenant, so the counters move by a delete and an insert. A minute
-- the new tenant already has (its own worker of the same name, in the same minute, when it
-- held the name before) keeps the new tenant's counts; lifetime totals add up.
minutes AS (
    DELETE FROM {schema}sqlbroker_metric_minute m
    USING old WHERE m.subscription = old.name AND m.tenant = coalesce(old.tenant, '')
      AND coalesce(old.tenant, '') <> coalesce(%(tenant)s::text, '')
    RETURNING m.*
),
minutes_in AS (
    INSERT INTO {schema}sqlbroker_metric_minute (
        subscription, minute, worker, tenant, completed, retried, dead,
        handler_count, handler_seconds, handler_buckets
    )
    SELECT subscription, minute, worker, coalesce(%(tenant)s::text, ''), completed, retried,
           dead, handler_count, handler_seconds, handler_buckets
    FROM minutes
    ON CONFLICT (subscription, minute, worker, tenant) DO NOTHING
),
totals AS (
    DELETE FROM {schema}sqlbroker_metric_total m
    USING old WHERE m.subscription = old.name AND m.tenant = coalesce(old.tenant, '')
      AND coalesce(old.tenant, '') <> coalesce(%(tenant)s::text, '')
    RETURNING m.*
),
totals_in AS (
    INSERT INTO {schema}sqlbroker_metric_total AS t (subscription, outcome, tenant, count)
    SELECT subscription, outcome, coalesce(%(tenant)s::text, ''), count FROM totals
    ON CONFLICT (subscription, outcome, tenant) DO UPDATE SET count = t.count + excluded.count
)
SELECT count(*) FROM moved
