-- sqlbroker schema 10 (SQLite): the database's identity, a random id written once, so that
-- two processes can tell whether they reached the same database: a Spark executor checks
-- it against its driver's before it writes or reads anything (a relative path or a file of
-- the same name on another host would otherwise be another database). A copy of the file
-- keeps the id: it counts as the same database.
CREATE TABLE sqlbroker_identity (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    database_id TEXT NOT NULL,
    created_at  REAL NOT NULL
);
INSERT INTO sqlbroker_identity (singleton, database_id, created_at)
VALUES (1, lower(hex(randomblob(16))), (julianday('now') - 2440587.5) * 86400.0);
