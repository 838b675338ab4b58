-- sqlbroker schema 11 (SQLite): nothing to change. Schema 11 gives PostgreSQL's dead
-- letters, archive rows and metrics their tenant; SQLite has neither login roles nor
-- row-level security (see 0007). The number is kept so both backends share one version.
SELECT 1;
