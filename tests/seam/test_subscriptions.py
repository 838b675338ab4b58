"""Subscriptions through the seam: create, extend, replace, list; the limits roll back."""

from __future__ import annotations

from typing import Any

import pytest

from sqlbroker.core.errors import LimitExceeded
from sqlbroker.core.limits import Limits
from sqlbroker.storage.factory import open_backend


def test_upsert_extends_or_replaces_the_patterns(backend: Any) -> None:
    first = backend.subscription_upsert(name="billing", patterns=["orders.*"], replace=False)
    assert first.patterns == ("orders.*",)
    more = backend.subscription_upsert(name="billing", patterns=["refunds.#"], replace=False)
    assert more.patterns == ("orders.*", "refunds.#")
    only = backend.subscription_upsert(name="billing", patterns=["invoices"], replace=True)
    assert only.patterns == ("invoices",)
    assert [(s.name, s.patterns) for s in backend.subscription_list()] == [
        ("billing", ("invoices",))
    ]


def test_past_a_limit_nothing_is_written(backend_url: str) -> None:
    limited: Any = open_backend(backend_url, limits=Limits(max_patterns=2))
    limited.migrate()
    try:
        limited.subscription_upsert(name="a", patterns=["x", "y"], replace=False)
        with pytest.raises(LimitExceeded):
            limited.subscription_upsert(name="b", patterns=["z"], replace=False)
        assert [s.name for s in limited.subscription_list()] == ["a"]
    finally:
        limited.close()


def test_an_upsert_in_a_failed_transaction_leaves_nothing(backend: Any) -> None:
    def failing() -> None:
        with backend.begin() as tx:
            tx.subscription_upsert(name="audit", patterns=["#"], replace=False)
            raise RuntimeError("the caller's own step failed")

    with pytest.raises(RuntimeError):
        failing()
    assert backend.subscription_list() == []
