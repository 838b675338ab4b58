-- sqlbroker schema 14 (PostgreSQL): pause and cancel (docs/flow-control.md).
--
-- A paused subscription keeps taking publishes but its claims return nothing; the flag is
-- a column so that a pause survives restarts and holds for every worker at once.
-- cancel_requested marks a running copy whose message was cancelled: a NOTIFY on the
-- cancel channel wakes its worker, which looks for the flag on the copies it runs, stops
-- the handler and archives the copy as cancelled. Both columns have constant defaults:
-- adding them rewrites no table.

ALTER TABLE {schema}sqlbroker_subscription ADD COLUMN paused boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}sqlbroker_message ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
