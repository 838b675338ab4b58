"""Layer 2: broker features built on storage (publishing rules, dead-letter admin, …)."""
