"""Framework adapters (sqlbroker.contrib)."""
