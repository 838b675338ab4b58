"""Processed keys through the seam: reserve, confirm, extend, release, forget, trim."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from sqlbroker.core.clock import ManualClock


def token() -> str:
    return str(uuid.uuid4())


def test_a_key_is_reserved_once_then_busy_then_done(backend: Any) -> None:
    first, second = token(), token()
    assert backend.processed_reserve(scope="s", key="k", token=first, lease=30, window=60) == (
        "reserved"
    )
    assert backend.processed_reserve(scope="s", key="k", token=second, lease=30, window=60) == (
        "busy"
    )
    assert backend.processed_confirm(scope="s", key="k", token=first, window=60)
    assert backend.processed_reserve(scope="s", key="k", token=second, lease=30, window=60) == (
        "done"
    )


def test_only_the_holder_confirms_extends_or_releases(backend: Any) -> None:
    holder, other = token(), token()
    backend.processed_reserve(scope="s", key="k", token=holder, lease=30, window=60)
    assert not backend.processed_confirm(scope="s", key="k", token=other, window=60)
    assert not backend.processed_extend(scope="s", key="k", token=other, lease=30)
    assert not backend.processed_release(scope="s", key="k", token=other)
    assert backend.processed_extend(scope="s", key="k", token=holder, lease=30)
    assert backend.processed_release(scope="s", key="k", token=holder)
    assert backend.processed_reserve(scope="s", key="k", token=other, lease=30, window=60) == (
        "reserved"
    )


def test_an_expired_lease_frees_the_key_and_trim_removes_past_windows(
    backend: Any, clock: ManualClock
) -> None:
    backend.processed_reserve(scope="s", key="a", token=token(), lease=5, window=60)
    clock.advance(6)
    assert backend.processed_reserve(scope="s", key="a", token=token(), lease=5, window=60) == (
        "reserved"
    )
    done = token()
    backend.processed_reserve(scope="s", key="b", token=done, lease=5, window=10)
    backend.processed_confirm(scope="s", key="b", token=done, window=10)
    assert backend.processed_trim(limit=100) == 0
    clock.advance(11)
    assert backend.processed_trim(limit=100) == 1  # "a" is within its window still
    assert not backend.processed_forget(scope="s", key="b")


def test_operations_in_one_transaction_commit_together(backend: Any) -> None:
    holder = token()
    with backend.begin() as tx:
        assert tx.processed_reserve(scope="s", key="k", token=holder, lease=30, window=60) == (
            "reserved"
        )
        assert tx.processed_confirm(scope="s", key="k", token=holder, window=60)
    assert backend.processed_reserve(scope="s", key="k", token=token(), lease=30, window=60) == (
        "done"
    )


def reserve_then_fail(backend: Any) -> None:
    with backend.begin() as tx:
        tx.processed_reserve(scope="s", key="k", token=token(), lease=30, window=60)
        raise RuntimeError("the caller's own step failed")


def test_a_failed_transaction_leaves_nothing(backend: Any) -> None:
    with pytest.raises(RuntimeError):
        reserve_then_fail(backend)
    assert backend.processed_reserve(scope="s", key="k", token=token(), lease=30, window=60) == (
        "reserved"
    )


def test_the_async_faces_run_the_same_operations(backend: Any) -> None:
    async def forget_then_fail() -> None:
        async with backend.begin_async() as tx:
            await tx.processed_forget(scope="s", key="k")
            raise RuntimeError("rolled back")

    async def main() -> list[Any]:
        holder = token()
        seen = [
            await backend.async_ops.processed_reserve(
                scope="s", key="k", token=holder, lease=30, window=60
            )
        ]
        async with backend.begin_async() as tx:
            seen.append(await tx.processed_confirm(scope="s", key="k", token=holder, window=60))
            seen.append(
                await tx.processed_reserve(scope="s", key="k", token=token(), lease=30, window=60)
            )
        with pytest.raises(RuntimeError):
            await forget_then_fail()
        seen.append(await backend.async_ops.processed_forget(scope="s", key="k"))
        if hasattr(backend, "close_async"):
            await backend.close_async()
        return seen

    assert asyncio.run(main()) == ["reserved", True, "done", True]
