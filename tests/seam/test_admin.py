"""Listings and the operator's actions through the seam: pending messages, dead letters
(list, get, replay, purge, each audited), the archive, stats and table counts."""

from __future__ import annotations

import json
from typing import Any

from tests.seam.support import claim, publish

from helpers import table_counts
from sqlbroker.core.message import Outcome, State
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.storage.base import DeadFilter


def kill(backend: Any, queue: str, count: int, reason: str = "poison") -> list[int]:
    publish(backend, queue, count)
    deliveries = claim(backend, queue, count)
    deaths = [Settlement.dead(Lease.of(d), reason) for d in deliveries]
    dead: list[int] = backend.message_settle_many(settlements=deaths)
    return dead


def test_pending_messages_are_listed_by_state(backend: Any) -> None:
    publish(backend, "orders", 3)
    claim(backend, "orders", 1)
    listed = backend.message_list(subscription="orders", state=None, limit=10)
    assert [m.state for m in listed] == [State.RUNNING, State.AVAILABLE, State.AVAILABLE]
    running = backend.message_list(subscription="orders", state=State.RUNNING, limit=10)
    assert len(running) == 1
    assert backend.message_list(subscription="other", state=None, limit=10) == []


def test_dead_letters_are_listed_got_replayed_and_audited(backend: Any) -> None:
    kill(backend, "orders", 3)
    dead = backend.dead_list(where=DeadFilter(), limit=10, after_id=None)
    assert [d.reason for d in dead] == ["poison"] * 3
    assert backend.dead_get(id=dead[0].id) == dead[0]
    assert backend.dead_get(id=-1) is None
    page = backend.dead_list(where=DeadFilter(), limit=10, after_id=dead[0].id)
    assert [d.id for d in page] == [d.id for d in dead[1:]]

    replayed = backend.dead_replay(where=DeadFilter(ids=(dead[0].id,)), actor="ops", note="fix")
    assert len(replayed) == 1
    assert [d.id for d in backend.dead_list(where=DeadFilter(), limit=10, after_id=None)] == [
        d.id for d in dead[1:]
    ]
    again = claim(backend, "orders")
    assert [d.id for d in again] == replayed
    assert again[0].attempt == 1  # attempts reset; the replay is counted on the copy

    assert backend.dead_purge(where=DeadFilter(), actor="ops", note=None) == 2
    assert backend.dead_list(where=DeadFilter(), limit=10, after_id=None) == []
    trail = backend.audit_list(limit=10, before_id=None)
    assert [entry.action for entry in trail] == ["dead.purge", "dead.replay"]
    assert trail[1].actor == "ops"
    detail = trail[1].detail if isinstance(trail[1].detail, dict) else json.loads(trail[1].detail)
    assert detail["delivery_ids"] == replayed
    assert detail["note"] == "fix"


def test_a_replay_recreates_a_deleted_subscription(backend: Any) -> None:
    kill(backend, "gone", 1)
    assert backend.subscription_delete(name="gone")
    backend.dead_replay(where=DeadFilter(subscription="gone"), actor="ops", note=None)
    assert "gone" in [s.name for s in backend.subscription_list()]
    assert len(claim(backend, "gone")) == 1


def test_nothing_matching_replays_or_purges_nothing_and_audits_nothing(backend: Any) -> None:
    where = DeadFilter(topic="nothing-here")
    assert backend.dead_replay(where=where, actor="ops", note=None) == []
    assert backend.dead_purge(where=where, actor="ops", note=None) == 0
    assert backend.audit_list(limit=10, before_id=None) == []


def test_a_replay_inside_a_failed_transaction_leaves_the_dead_letter(backend: Any) -> None:
    kill(backend, "orders", 1)
    try:
        with backend.begin() as tx:
            assert len(tx.dead_replay(where=DeadFilter(), actor="ops", note=None)) == 1
            raise RuntimeError("the operator's own step failed")
    except RuntimeError:
        pass
    assert len(backend.dead_list(where=DeadFilter(), limit=10, after_id=None)) == 1
    assert backend.audit_list(limit=10, before_id=None) == []


def test_stats_archive_and_counts(backend: Any) -> None:
    publish(backend, "orders", 3)
    done = claim(backend, "orders", 1)
    backend.message_settle_many(settlements=[Settlement.complete(Lease.of(d)) for d in done])
    kill(backend, "audit", 1)
    stats = {s.subscription: s for s in backend.stats_collect()}
    assert (stats["orders"].ready, stats["orders"].running, stats["orders"].dead) == (2, 0, 0)
    assert stats["orders"].oldest_ready_age is not None
    assert stats["orders"].oldest_ready_age >= 0
    assert stats["audit"].dead == 1
    archived = backend.archive_list(
        subscription="orders", outcome=Outcome.COMPLETED, message_id=None, limit=10
    )
    assert [a.id for a in archived] == [done[0].id]
    counts = table_counts(backend)
    assert counts["sqlbroker_message"] == 2
    assert counts["sqlbroker_dead"] == 1
    assert counts["sqlbroker_archive"] == 1
