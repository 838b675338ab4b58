-- sqlbroker schema 14 (SQLite): pause and cancel (docs/flow-control.md).
--
-- A paused subscription keeps taking publishes but its claims return nothing; the flag is
-- a column so that a pause survives restarts and holds for every worker at once.
-- cancel_requested marks a running copy whose message was cancelled: its worker looks for
-- the flag on the copies it runs, stops the handler and archives the copy as cancelled.

ALTER TABLE sqlbroker_subscription ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sqlbroker_message ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
