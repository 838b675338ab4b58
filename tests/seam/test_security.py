"""Roles and tenants through the seam: granted and shown on PostgreSQL, refused on SQLite."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from sqlbroker.core.errors import ConfigurationError, NotFound
from sqlbroker.storage.base import ROLE_GROUPS, TenantRole


def postgres_only(backend: Any) -> None:
    if backend.settings.dialect == "sqlite":
        pytest.skip("SQLite refuses: see test_sqlite_refuses_every_security_operation")


def prefix() -> str:
    return f"seam_{uuid.uuid4().hex[:8]}"


def test_sqlite_refuses_every_security_operation(backend: Any) -> None:
    if backend.settings.dialect != "sqlite":
        pytest.skip("PostgreSQL has roles and row-level security")
    refused = [
        lambda: backend.roles_grant(prefix="p", create=True),
        lambda: backend.roles_show(prefix="p"),
        lambda: backend.roles_tables(),
        lambda: backend.tenant_enable(enabled=True),
        lambda: backend.tenant_set(role="r", tenant="t"),
        lambda: backend.tenant_remove(role="r"),
        lambda: backend.tenant_list(),
        lambda: backend.tenant_assign(subscription="s", tenant="t"),
    ]
    for operation in refused:
        with pytest.raises(ConfigurationError, match="needs PostgreSQL"):
            operation()
    assert backend.tenant_enabled() is False

    def in_a_transaction() -> None:
        with backend.begin() as tx:
            tx.tenant_list()

    with pytest.raises(ConfigurationError, match="tenant isolation needs PostgreSQL"):
        in_a_transaction()


def test_a_missing_group_role_is_refused_unless_created(backend: Any) -> None:
    postgres_only(backend)
    name = prefix()
    with pytest.raises(ConfigurationError, match=f"{name}_migrator does not exist"):
        backend.roles_grant(prefix=name, create=False)
    assert backend.roles_show(prefix=name) == {}
    granted = backend.roles_grant(prefix=name, create=True)
    tables = backend.roles_tables()
    assert "sqlbroker_message" in tables
    assert set(granted) == {f"{name}_{group}" for group in ROLE_GROUPS if group != "migrator"}
    assert set(granted[f"{name}_reader"]) == set(tables)
    assert backend.roles_show(prefix=name) == granted
    # Idempotent, and the same inside a transaction.
    assert backend.roles_grant(prefix=name, create=False) == granted
    with backend.begin() as tx:
        assert tx.roles_grant(prefix=name, create=False) == granted


def test_tenants_map_roles_and_take_subscriptions(backend: Any) -> None:
    postgres_only(backend)
    name = prefix()
    backend.roles_grant(prefix=name, create=True)
    role = f"{name}_reader"
    assert backend.tenant_enabled() is False
    backend.tenant_enable(enabled=True)
    assert backend.tenant_enabled() is True
    with pytest.raises(NotFound, match="no PostgreSQL role"):
        backend.tenant_set(role=f"{name}_nobody", tenant="acme")
    backend.tenant_set(role=role, tenant="acme")
    backend.tenant_set(role=role, tenant="globex")  # replaces
    assert backend.tenant_list() == [TenantRole(role=role, tenant="globex")]
    backend.subscription_upsert(name="jobs", patterns=["jobs"], replace=False)
    assert backend.tenant_assign(subscription="jobs", tenant="globex")
    assert not backend.tenant_assign(subscription="nope", tenant="globex")
    assert backend.tenant_remove(role=role)
    assert not backend.tenant_remove(role=role)
    backend.tenant_enable(enabled=False)
    assert backend.tenant_enabled() is False


def test_the_async_faces_run_the_same_operations(backend: Any) -> None:
    postgres_only(backend)

    async def main() -> list[Any]:
        seen: list[Any] = [await backend.async_ops.tenant_enabled()]
        async with backend.begin_async() as tx:
            seen.append(await tx.tenant_list())
        await backend.close_async()
        return seen

    assert asyncio.run(main()) == [False, []]
