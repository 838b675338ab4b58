-- sqlbroker schema 12 (PostgreSQL): stored results (docs/results.md).
--
-- A handler's return value, when it returns one, is kept here with its copy: a table of
-- its own rather than a column of the archive, so that results exist with
-- archive_completed=False too, have their own retention (result_ttl, trimmed by the
-- reaper) and a lookup reads one narrow row. A copy that returned None writes nothing
-- here: its completion is read from the archive. Failed copies keep their error in the
-- dead letters (a lookup reaches them by message id through sqlbroker_dead_message_id).

CREATE TABLE {schema}sqlbroker_result (
    delivery_id  bigint PRIMARY KEY,
    message_id   uuid NOT NULL,
    subscription text NOT NULL,
    value        bytea NOT NULL,
    finished_at  timestamptz NOT NULL,
    tenant       text
);
CREATE INDEX sqlbroker_result_message_id ON {schema}sqlbroker_result (message_id);
CREATE INDEX sqlbroker_result_finished ON {schema}sqlbroker_result (finished_at);

-- A result belongs to the tenant of its subscription when it was written, as archive rows
-- and dead letters do (schema 11).
CREATE POLICY sqlbroker_tenant_isolation ON {schema}sqlbroker_result
    USING (tenant IS NOT DISTINCT FROM (SELECT {schema}sqlbroker_session_tenant()));

DO $enabled$
BEGIN
    IF (SELECT c.relrowsecurity FROM pg_catalog.pg_class c
        WHERE c.oid = '{schema}sqlbroker_message'::regclass) THEN
        ALTER TABLE {schema}sqlbroker_result
            ALTER COLUMN tenant SET DEFAULT {schema}sqlbroker_session_tenant();
        ALTER TABLE {schema}sqlbroker_result ENABLE ROW LEVEL SECURITY;
    END IF;
END
$enabled$;
