-- sqlbroker schema 12 (SQLite): stored results (docs/results.md).
--
-- A handler's return value, when it returns one, is kept here with its copy: a table of
-- its own rather than a column of the archive, so that results exist with
-- archive_completed=False too, have their own retention (result_ttl, trimmed by the
-- reaper) and a lookup reads one narrow row. A copy that returned None writes nothing
-- here: its completion is read from the archive. Failed copies keep their error in the
-- dead letters (a lookup reaches them by message id through sqlbroker_dead_message_id).

CREATE TABLE sqlbroker_result (
    delivery_id  INTEGER PRIMARY KEY,
    message_id   TEXT NOT NULL,
    subscription TEXT NOT NULL,
    value        BLOB NOT NULL,
    finished_at  REAL NOT NULL
);
CREATE INDEX sqlbroker_result_message_id ON sqlbroker_result (message_id);
CREATE INDEX sqlbroker_result_finished ON sqlbroker_result (finished_at);
