"""Framework adapters (sqlbroker.contrib) tested with the real frameworks."""
