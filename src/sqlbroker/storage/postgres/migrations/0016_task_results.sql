-- sqlbroker schema 16 (PostgreSQL): results kept by a caller's key (docs/celery.md).
--
-- Celery's result backend keys a task's result by Celery's task id, not by sqlbroker's
-- message id, and keeps group results and chord counters next to them: a small key-value
-- table. Every row has an expiry (Celery's result_expires, or the broker's result_ttl when
-- Celery sets none): reads ignore an expired row and the reaper deletes it, so nothing is
-- kept without bound. ``value`` is NULL for a counter (a chord's, ``counter`` holds it).

CREATE TABLE {schema}sqlbroker_task_result (
    key        text NOT NULL,
    tenant     text NOT NULL DEFAULT '',
    value      bytea,
    counter    bigint NOT NULL DEFAULT 0,
    stored_at  timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, tenant)
);
CREATE INDEX sqlbroker_task_result_expires ON {schema}sqlbroker_task_result (expires_at);

-- Keys are per tenant, as processed keys are (schema 9).
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_task_result
    USING (tenant = coalesce((SELECT {schema}sqlbroker_session_tenant()), ''));

DO $enabled$
BEGIN
    IF (SELECT c.relrowsecurity FROM pg_catalog.pg_class c
        WHERE c.oid = '{schema}sqlbroker_message'::regclass) THEN
        ALTER TABLE {schema}sqlbroker_task_result
            ALTER COLUMN tenant SET DEFAULT coalesce({schema}sqlbroker_session_tenant(), '');
        ALTER TABLE {schema}sqlbroker_task_result ENABLE ROW LEVEL SECURITY;
    END IF;
END
$enabled$;
