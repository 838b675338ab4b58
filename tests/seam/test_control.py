"""Pause and resume on the seam, both dialects: the claim skips a paused subscription, the
flag is in stats, the change is audited, an unknown name writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from tests.seam.support import claim, publish

from helpers import table_counts
from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import NotFound


def test_a_paused_subscription_claims_nothing_until_resumed(backend: Any) -> None:
    publish(backend, "jobs", 2)
    publish(backend, "other", 1)
    backend.subscription_pause(name="jobs", paused=True, actor="test", note="deploy")
    assert claim(backend, "jobs", 5) == []
    assert len(claim(backend, "other", 5)) == 1
    paused = {s.subscription: s.paused for s in backend.stats_collect()}
    assert paused == {"jobs": True, "other": False}
    backend.subscription_pause(name="jobs", paused=False, actor="test", note=None)
    assert len(claim(backend, "jobs", 5)) == 2
    entries = backend.audit_list(limit=5, before_id=None)
    assert [(e.actor, e.action, e.detail) for e in entries] == [
        ("test", "subscription.resume", {"subscription": "jobs", "note": None}),
        ("test", "subscription.pause", {"subscription": "jobs", "note": "deploy"}),
    ]


def test_pausing_an_unknown_subscription_writes_nothing(backend: Any) -> None:
    before = table_counts(backend)
    with pytest.raises(NotFound):
        backend.subscription_pause(name="nope", paused=True, actor="test", note=None)
    assert table_counts(backend) == before


def test_a_cancelled_copy_whose_worker_was_lost_ends_cancelled(
    backend: Any, clock: ManualClock
) -> None:
    cancelled_id, lost_id = publish(backend, "jobs", 2)
    claim(backend, "jobs", 2)
    assert backend.message_cancel_many(message_ids=[cancelled_id], actor="ops") == 1
    clock.advance(31)
    result = backend.lease_release_expired(limit=10)
    assert (result.released, result.dead) == (1, 0)
    rows = backend.archive_list(subscription="jobs", outcome=None, message_id=None, limit=10)
    assert [(row.message_id, row.outcome.value) for row in rows] == [(cancelled_id, "cancelled")]
    assert [
        p.message_id for p in backend.message_list(subscription="jobs", state=None, limit=10)
    ] == [lost_id]
