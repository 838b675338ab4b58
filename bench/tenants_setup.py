"""The database the tenant-isolation benchmarks share: a throwaway PostgreSQL database,
migrated and granted, with two tenant logins (``bench_acme`` for ``acme`` and
``bench_globex`` for ``globex``) holding every runtime group, and tenants enabled."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sqlbroker
from pgserver import PostgresServer, quote_ident
from sqlbroker.features import security

TENANTS = {"acme": "bench_acme", "globex": "bench_globex"}


def two_tenants(pg: PostgresServer, *, generic_plans: bool = False) -> tuple[str, dict[str, str]]:
    """Set the database ``bench`` up on ``pg``; return the owner's URL and each tenant's
    login URL. ``generic_plans`` makes the logins use generic plans from the first run."""
    pg.create_database("bench")
    admin_url = pg.url("bench")
    with sqlbroker.Broker(admin_url, migrate=True) as admin:
        admin.migrate()
        security.grant_roles(admin.backend, create=True)
        groups = ", ".join(
            quote_ident(role)
            for group, role in security.role_names().items()
            if group != "migrator"
        )
        for tenant, login in TENANTS.items():
            pg.execute(f"CREATE ROLE {quote_ident(login)} LOGIN IN ROLE {groups}")
            if generic_plans:
                pg.execute(
                    f"ALTER ROLE {quote_ident(login)} SET plan_cache_mode = force_generic_plan"
                )
            security.set_tenant_role(admin.backend, tenant=tenant, role=login)
        security.enable_tenants(admin.backend)
    urls = {t: admin_url.replace("//postgres@", f"//{login}@") for t, login in TENANTS.items()}
    return admin_url, urls
