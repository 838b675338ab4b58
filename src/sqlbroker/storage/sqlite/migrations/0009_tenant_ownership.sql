-- sqlbroker schema 9 (SQLite): nothing to change. Schema 9 gives PostgreSQL's runtime
-- tables their tenant and its row-level policies; SQLite has neither login roles nor
-- row-level security (see 0007). The number is kept so both backends share one version.
SELECT 1;
