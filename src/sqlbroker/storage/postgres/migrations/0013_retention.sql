-- sqlbroker schema 13 (PostgreSQL): retention (docs/reliability.md, "Retention").
--
-- 1. A subscription may keep its archive rows and dead letters for a time of its own
--    (seconds; NULL: the broker's default, Broker(archive_retention=, dead_retention=)).
-- 2. The archive is range-partitioned by finished_at, one partition per UTC day, plus a
--    default partition so that an insert never fails for want of a partition. Retention
--    drops whole days instead of deleting rows; the reaper creates days ahead of time
--    (sqlbroker_archive_maintain, below). The existing table is converted keeping every
--    row, its ids (and the id sequence's position: the Spark export's watermarks), its
--    indexes, its row-level-security policy and switch, its tenant default and its grants.

ALTER TABLE {schema}sqlbroker_subscription
    ADD COLUMN archive_retention double precision
        CHECK (archive_retention > 0 AND archive_retention <= 3153600000),
    ADD COLUMN dead_retention double precision
        CHECK (dead_retention > 0 AND dead_retention <= 3153600000);

-- Retention deletes a subscription's own rows past its time: the lookups by subscription
-- and time must not scan the other subscriptions' rows.
CREATE INDEX sqlbroker_dead_retention ON {schema}sqlbroker_dead (subscription, dead_at);

ALTER TABLE {schema}sqlbroker_archive RENAME TO sqlbroker_archive_unpartitioned;

-- The column definitions, NOT NULLs, CHECKs and defaults (the tenant default set by
-- `tenants enable`) are copied; the identity is not (a partitioned table has none before
-- PostgreSQL 17): ids come from a sequence that resumes where the identity stopped.
CREATE TABLE {schema}sqlbroker_archive (
    LIKE {schema}sqlbroker_archive_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS
) PARTITION BY RANGE (finished_at);

CREATE TABLE {schema}sqlbroker_archive_default
    PARTITION OF {schema}sqlbroker_archive DEFAULT;

-- sqlbroker_archive_maintain(at, ahead, drop_before): create the daily partitions of the
-- UTC days from `at` to `ahead` days after it, and drop those whose upper bound is at or
-- before `drop_before` (NULL: drop nothing). Returns {created, dropped}.
--
-- Leaderless: every reaper may call it; one at a time does the work (a transaction-level
-- advisory lock; the others return {0, 0} at once). DDL waits at most 200 ms for its
-- lock, so a long reader of the archive delays a partition, and the writers queued behind
-- the DDL wait no longer than that: a day that could not be created or dropped now is
-- retried next pass (days are created well ahead; the default partition takes rows
-- meanwhile).
--
-- It runs as the owner (runtime roles may not create tables). A tenant-bound caller (row
-- security binds it to its own rows) only drops days that hold no row at all: dropping
-- a day would otherwise remove other tenants' rows.
DO $maintain$
DECLARE
    ns text := (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class c
                WHERE c.oid = '{schema}sqlbroker_archive'::regclass);
    body text := $body$
DECLARE
    ns constant text := @ns@;
    day date;
    lower_bound timestamptz;
    partition_name text;
    created integer := 0;
    dropped integer := 0;
    part record;
    upper_bound timestamptz;
    tenant_bound boolean;
    holds_rows boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(1936811627, hashtext(ns)) THEN
        RETURN ARRAY[0, 0];
    END IF;
    at := coalesce(at, statement_timestamp());
    ahead := least(greatest(coalesce(ahead, 0), 0), 60);
    FOR offset_days IN 0 .. ahead LOOP
        day := (at AT TIME ZONE 'UTC')::date + offset_days;
        lower_bound := day::timestamp AT TIME ZONE 'UTC';
        partition_name := 'sqlbroker_archive_p' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(ns || '.' || quote_ident(partition_name)) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %s.%I PARTITION OF %s.sqlbroker_archive'
                           ' FOR VALUES FROM (%L) TO (%L)',
                           ns, partition_name, ns, lower_bound, lower_bound + interval '1 day');
            created := created + 1;
        EXCEPTION
            WHEN check_violation THEN
                -- The default partition already holds rows of that day (no reaper ran for
                -- a while): move them into the new day, then attach it.
                EXECUTE format('CREATE TABLE %s.%I (LIKE %s.sqlbroker_archive'
                               ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                               ns, partition_name, ns);
                EXECUTE format('WITH moved AS (DELETE FROM %s.sqlbroker_archive_default'
                               ' WHERE finished_at >= %L AND finished_at < %L RETURNING *)'
                               ' INSERT INTO %s.%I SELECT * FROM moved',
                               ns, lower_bound, lower_bound + interval '1 day', ns, partition_name);
                EXECUTE format('ALTER TABLE %s.sqlbroker_archive ATTACH PARTITION %s.%I'
                               ' FOR VALUES FROM (%L) TO (%L)',
                               ns, ns, partition_name, lower_bound, lower_bound + interval '1 day');
                created := created + 1;
            WHEN invalid_object_definition OR lock_not_available THEN
                -- Overlaps a partition the migration made for older rows, or busy: skip.
                NULL;
        END;
    END LOOP;
    IF drop_before IS NULL THEN
        RETURN ARRAY[created, 0];
    END IF;
    tenant_bound := (SELECT t.tenant FROM sqlbroker_tenant_table t
                     WHERE t.login_role = session_user) IS NOT NULL;
    FOR part IN
        SELECT c.oid::regclass::text AS name, pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound
        FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = (ns || '.sqlbroker_archive')::regclass
    LOOP
        CONTINUE WHEN part.bound = 'DEFAULT';
        upper_bound := substring(part.bound FROM 'TO \(''([^'']*)''\)')::timestamptz;
        CONTINUE WHEN upper_bound IS NULL OR upper_bound > drop_before;
        IF tenant_bound THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', part.name) INTO holds_rows;
            CONTINUE WHEN holds_rows;
        END IF;
        BEGIN
            EXECUTE format('DROP TABLE %s', part.name);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    RETURN ARRAY[created, dropped];
END
$body$;
BEGIN
    body := replace(replace(body, '@ns@', quote_literal(ns)),
                    'sqlbroker_tenant_table', ns || '.sqlbroker_tenant');
    EXECUTE format(
        'CREATE FUNCTION %s.sqlbroker_archive_maintain(at timestamptz, ahead integer,'
        ' drop_before timestamptz) RETURNS integer[] LANGUAGE plpgsql VOLATILE SECURITY DEFINER'
        ' SET search_path = pg_catalog, pg_temp SET lock_timeout = ''200ms'''
        ' SET TimeZone = ''UTC'' SET DateStyle = ''ISO, YMD'' AS %L',
        ns, body);
    EXECUTE format('REVOKE ALL ON FUNCTION %s.sqlbroker_archive_maintain(timestamptz, integer,'
                   ' timestamptz) FROM PUBLIC', ns);
END
$maintain$;

-- Ids continue from where the old identity stopped (set below): the Spark export keeps
-- watermarks of archive ids, which must never be handed out twice.
CREATE SEQUENCE {schema}sqlbroker_archive_id_seq_13 AS bigint;
ALTER TABLE {schema}sqlbroker_archive
    ALTER COLUMN id SET DEFAULT nextval('{schema}sqlbroker_archive_id_seq_13');
ALTER SEQUENCE {schema}sqlbroker_archive_id_seq_13 OWNED BY {schema}sqlbroker_archive.id;

-- The rows, into daily partitions: a partition for each day of the last 60 that holds
-- rows, and the days from today to three days ahead (what the reaper keeps ahead). Older
-- rows go to one partition that retention drops whole once its last day has passed; rows
-- dated further ahead go to the default partition.
DO $convert$
DECLARE
    ns text := (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class c
                WHERE c.oid = '{schema}sqlbroker_archive'::regclass);
    today date := (statement_timestamp() AT TIME ZONE 'UTC')::date;
    first_day date := (statement_timestamp() AT TIME ZONE 'UTC')::date - 60;
    day date;
    next_id bigint;
    grant_row record;
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}sqlbroker_archive_unpartitioned
               WHERE finished_at < first_day::timestamp AT TIME ZONE 'UTC') THEN
        EXECUTE format('CREATE TABLE %s.sqlbroker_archive_before PARTITION OF %s.sqlbroker_archive'
                       ' FOR VALUES FROM (MINVALUE) TO (%L)',
                       ns, ns, first_day::timestamp AT TIME ZONE 'UTC');
    END IF;
    FOR day IN
        SELECT DISTINCT (a.finished_at AT TIME ZONE 'UTC')::date
        FROM {schema}sqlbroker_archive_unpartitioned a
        WHERE a.finished_at >= first_day::timestamp AT TIME ZONE 'UTC'
          AND a.finished_at < today::timestamp AT TIME ZONE 'UTC'
    LOOP
        PERFORM {schema}sqlbroker_archive_maintain(day::timestamp AT TIME ZONE 'UTC', 0, NULL);
    END LOOP;
    PERFORM {schema}sqlbroker_archive_maintain(statement_timestamp(), 3, NULL);

    next_id := greatest(
        (SELECT coalesce(max(id), 0) FROM {schema}sqlbroker_archive_unpartitioned),
        coalesce(pg_catalog.pg_sequence_last_value(pg_catalog.pg_get_serial_sequence(
            ns || '.sqlbroker_archive_unpartitioned', 'id')::regclass), 0));
    INSERT INTO {schema}sqlbroker_archive SELECT * FROM {schema}sqlbroker_archive_unpartitioned;
    PERFORM pg_catalog.setval('{schema}sqlbroker_archive_id_seq_13', greatest(next_id, 1), next_id > 0);

    -- Whoever could use the old table can use the new one (and its sequence, to insert;
    -- and, to delete, the partition maintenance and the dead letters past their time).
    FOR grant_row IN
        SELECT p.grantee::regrole::text AS grantee, p.privilege_type
        FROM pg_catalog.pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) p
        WHERE c.oid = '{schema}sqlbroker_archive_unpartitioned'::regclass
          AND p.grantee <> 0 AND p.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON TABLE %s.sqlbroker_archive TO %s',
                       grant_row.privilege_type, ns, grant_row.grantee);
        IF grant_row.privilege_type = 'INSERT' THEN
            EXECUTE format('GRANT USAGE ON SEQUENCE %s.sqlbroker_archive_id_seq_13 TO %s',
                           ns, grant_row.grantee);
        ELSIF grant_row.privilege_type = 'DELETE' THEN
            -- The reaper (the consumer role) now also deletes dead letters past their time.
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s.sqlbroker_archive_maintain(timestamptz,'
                           ' integer, timestamptz) TO %s', ns, grant_row.grantee);
            EXECUTE format('GRANT DELETE ON TABLE %s.sqlbroker_dead TO %s', ns, grant_row.grantee);
        END IF;
    END LOOP;
    IF (SELECT c.relrowsecurity FROM pg_catalog.pg_class c
        WHERE c.oid = '{schema}sqlbroker_archive_unpartitioned'::regclass) THEN
        EXECUTE format('ALTER TABLE %s.sqlbroker_archive ENABLE ROW LEVEL SECURITY', ns);
    END IF;
END
$convert$;

DROP TABLE {schema}sqlbroker_archive_unpartitioned;
ALTER SEQUENCE {schema}sqlbroker_archive_id_seq_13 RENAME TO sqlbroker_archive_id_seq;

-- The old table's indexes and policy (schemas 1, 3 and 11), on every partition; the key
-- holds the partition column, as it must. Retention reads a subscription's oldest rows.
ALTER TABLE {schema}sqlbroker_archive ADD CONSTRAINT sqlbroker_archive_pkey PRIMARY KEY (id, finished_at);
CREATE INDEX sqlbroker_archive_finished ON {schema}sqlbroker_archive (finished_at);
CREATE INDEX sqlbroker_archive_message_id ON {schema}sqlbroker_archive (message_id);
CREATE INDEX sqlbroker_archive_rare ON {schema}sqlbroker_archive (outcome, subscription, finished_at)
    WHERE outcome IN ('expired', 'unrouted');
CREATE INDEX sqlbroker_archive_retention ON {schema}sqlbroker_archive (subscription, finished_at);
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_archive
    USING (tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant()));
