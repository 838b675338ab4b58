-- SQLite session statements: the pragmas every pooled connection runs, the write
-- transaction (BEGIN IMMEDIATE takes the write lock up front) and the savepoint that joins
-- a caller's transaction. PRAGMA takes no bound parameters: one block per allowed value.

-- name: session_wal
PRAGMA journal_mode = WAL

-- name: session_journal_limit
-- Keep the WAL bounded: truncate it back to 64 MiB after each checkpoint.
PRAGMA journal_size_limit = 67108864

-- name: session_foreign_keys
PRAGMA foreign_keys = ON

-- name: session_synchronous_full
PRAGMA synchronous = FULL

-- name: session_synchronous_normal
PRAGMA synchronous = NORMAL

-- name: session_synchronous
PRAGMA synchronous

-- name: session_data_version
PRAGMA data_version

-- name: session_database_list
PRAGMA database_list

-- name: write_begin
BEGIN IMMEDIATE

-- name: write_commit
COMMIT

-- name: write_rollback
ROLLBACK

-- name: savepoint
SAVEPOINT sqlbroker

-- name: savepoint_release
RELEASE SAVEPOINT sqlbroker

-- name: savepoint_rollback
ROLLBACK TO SAVEPOINT sqlbroker
