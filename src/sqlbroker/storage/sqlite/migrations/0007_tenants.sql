-- sqlbroker schema 7 (SQLite): nothing to change. Tenants rely on PostgreSQL's login roles
-- and row-level security, which SQLite does not have: `sqlbroker tenants …` refuses there
-- with a ConfigurationError. The number is kept so both backends share one schema version.
SELECT 1;
