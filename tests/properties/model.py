"""An in-memory model of one broker database, for the state machine to check against.

The model knows the documented contract (DESIGN §1, §2, §6) and nothing of the SQL: which
copies a publish creates (fan-out by pattern, queues, unrouted), which a claim may return
(priority, then ``available_at``, then publish order; only the head of an ordering key;
nothing delayed or expired), when a lease token is stale, how attempts count, when a copy is
dead-lettered, expired, cancelled or completed, and what the stats say.

Times are float seconds since the epoch. The state machine moves its clock by whole seconds
from a whole second, so every time the model computes is exact in both databases (SQLite
keeps REAL seconds, PostgreSQL microseconds) and boundaries are compared exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEAD_EXHAUSTED = "exhausted"
DEAD_REJECTED = "rejected"
DEAD_WORKER_LOST = "worker-lost"


def topic_matches(pattern: str, topic: str) -> bool:
    """AMQP topic matching, written independently of ``sqlbroker.core.topics``."""
    return _match(pattern.split("."), topic.split("."))


def _match(parts: list[str], words: list[str]) -> bool:
    if not parts:
        return not words
    head = parts[0]
    if head == "#":
        return any(_match(parts[1:], words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return head in ("*", words[0]) and _match(parts[1:], words[1:])


def encoded(payload: Any) -> str:
    """What the idempotency check compares: the payload's JSON text."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Copy:
    """One subscription's copy of a message, as the model expects it in the hot table."""

    seq: int
    message_id: str
    subscription: str
    topic: str
    payload: Any
    priority: int
    key: str | None
    available_at: float
    expires_at: float | None
    max_attempts: int
    attempts: int = 0
    token: str | None = None
    lease_expires_at: float | None = None

    @property
    def ident(self) -> tuple[str, str]:
        return (self.message_id, self.subscription)


@dataclass(frozen=True)
class Finished:
    """A copy that left the hot table (archive or dead letters)."""

    outcome: str
    attempts: int


@dataclass(frozen=True)
class PublishItem:
    topic: str
    payload: Any
    queue: str | None = None
    priority: int = 2
    key: str | None = None
    delay: int | None = None
    ttl: int | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    dedupe_window: int | None = None


@dataclass(frozen=True)
class PublishPlan:
    """What a publish call must do: raise a conflict, or return these ids.

    ``duplicate_of[i]`` is the id item ``i`` must return when it is a duplicate: a string
    (an earlier publish), an int (an earlier item of the same batch) or ``None`` (new).
    """

    conflict: bool
    duplicate_of: tuple[str | int | None, ...]


@dataclass
class Model:
    now: float
    default_max_attempts: int
    default_dedupe_window: float
    subscriptions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    queues: set[str] = field(default_factory=set)
    hot: dict[tuple[str, str], Copy] = field(default_factory=dict)
    key_lines: dict[tuple[str, str], list[Copy]] = field(default_factory=dict)
    archive: dict[tuple[str, str | None], Finished] = field(default_factory=dict)
    dead: dict[tuple[str, str], Finished] = field(default_factory=dict)
    dedupe: dict[tuple[str, str], tuple[str, str, float]] = field(default_factory=dict)
    seq: int = 0

    # --- routing and publishing ----------------------------------------------------------------

    def subscribe(self, name: str, patterns: Sequence[str]) -> None:
        old = self.subscriptions.get(name, ())
        self.subscriptions[name] = tuple(sorted(set(old) | set(patterns)))

    def routes(self, item: PublishItem) -> list[str]:
        if item.queue is not None:
            return [item.queue]
        return sorted(
            name
            for name, patterns in self.subscriptions.items()
            if any(topic_matches(p, item.topic) for p in patterns)
        )

    def plan_publish(self, items: Sequence[PublishItem]) -> PublishPlan:
        """Decide idempotency for a batch in one transaction, before the call."""
        seen: dict[tuple[str, str], tuple[int, str]] = {}
        duplicate_of: list[str | int | None] = []
        for index, item in enumerate(items):
            if item.idempotency_key is None:
                duplicate_of.append(None)
                continue
            slot = (item.topic, item.idempotency_key)
            text = encoded(item.payload)
            if slot in seen:
                first, first_text = seen[slot]
                if first_text != text:
                    return PublishPlan(conflict=True, duplicate_of=())
                duplicate_of.append(first)
                continue
            live = self.dedupe.get(slot)
            if live is not None and live[2] > self.now:
                if live[1] != text:
                    return PublishPlan(conflict=True, duplicate_of=())
                duplicate_of.append(live[0])
                continue
            seen[slot] = (index, text)
            duplicate_of.append(None)
        return PublishPlan(conflict=False, duplicate_of=tuple(duplicate_of))

    def apply_publish(
        self, items: Sequence[PublishItem], plan: PublishPlan, ids: Sequence[str]
    ) -> None:
        """Record a publish that returned ``ids`` (already checked against ``plan``)."""
        for item, duplicate, message_id in zip(items, plan.duplicate_of, ids, strict=True):
            if duplicate is not None:
                continue
            if item.queue is not None:
                self.queues.add(item.queue)
                self.subscriptions.setdefault(item.queue, (item.queue,))
            if item.idempotency_key is not None:
                window = item.dedupe_window or self.default_dedupe_window
                self.dedupe[(item.topic, item.idempotency_key)] = (
                    message_id,
                    encoded(item.payload),
                    self.now + window,
                )
            targets = self.routes(item)
            if not targets:
                self.archive[(message_id, None)] = Finished("unrouted", 0)
            self.seq += 1
            for subscription in targets:
                copy = Copy(
                    seq=self.seq,
                    message_id=message_id,
                    subscription=subscription,
                    topic=item.topic,
                    payload=item.payload,
                    priority=item.priority,
                    key=item.key,
                    available_at=self.now + (item.delay or 0),
                    expires_at=None if item.ttl is None else self.now + item.ttl,
                    max_attempts=item.max_attempts or self.default_max_attempts,
                )
                self.hot[copy.ident] = copy
                if copy.key is not None:
                    self.key_lines.setdefault((subscription, copy.key), []).append(copy)

    # --- the copies' states ----------------------------------------------------------------------

    def is_head(self, copy: Copy) -> bool:
        if copy.key is None:
            return True
        return self.key_lines[(copy.subscription, copy.key)][0] is copy

    def state(self, copy: Copy) -> str:
        if copy.token is not None:
            return "running"
        if not self.is_head(copy):
            return "blocked"
        return "available" if copy.available_at <= self.now else "scheduled"

    def claimable(self, subscription: str) -> list[Copy]:
        """Every copy a claim may take now, in the documented order."""
        found = [
            c
            for c in self.hot.values()
            if c.subscription == subscription
            and self.state(c) == "available"
            and (c.expires_at is None or c.expires_at > self.now)
        ]
        return sorted(found, key=claim_order)

    def _remove(self, copy: Copy) -> None:
        del self.hot[copy.ident]
        if copy.key is not None:
            line = self.key_lines[(copy.subscription, copy.key)]
            line.remove(copy)
            if not line:
                del self.key_lines[(copy.subscription, copy.key)]

    def finish(self, copy: Copy, outcome: str) -> None:
        self._remove(copy)
        self.archive[copy.ident] = Finished(outcome, copy.attempts)

    def kill(self, copy: Copy, reason: str) -> None:
        self._remove(copy)
        self.dead[copy.ident] = Finished(reason, copy.attempts)

    def holder(self, message_id: str, subscription: str, token: str) -> Copy | None:
        """The copy whose current lease is ``token``, or ``None`` when the token is stale."""
        copy = self.hot.get((message_id, subscription))
        if copy is None or copy.token != token:
            return None
        return copy

    # --- consuming -----------------------------------------------------------------------------

    def claimed(self, copy: Copy, token: str, lease: float) -> None:
        copy.attempts += 1
        copy.token = token
        copy.lease_expires_at = self.now + lease

    def retried(self, copy: Copy, after: float) -> None:
        copy.token = None
        copy.lease_expires_at = None
        copy.available_at = self.now + after

    def released(self, copy: Copy) -> None:
        copy.token = None
        copy.lease_expires_at = None
        copy.attempts = max(copy.attempts - 1, 0)

    def cancel(self, message_id: str) -> int:
        chosen = [
            c for c in list(self.hot.values()) if c.message_id == message_id and c.token is None
        ]
        for copy in chosen:
            self.finish(copy, "cancelled")
        return len(chosen)

    def reap(self) -> dict[str, int]:
        """One ``Broker.reap()``: spent leases die, other expired leases are released, then
        TTLs expire (the copies just released included), then old idempotency keys go."""
        released, dead = self.take_back_expired()
        expired = [
            c
            for c in list(self.hot.values())
            if c.token is None and c.expires_at is not None and c.expires_at <= self.now
        ]
        for copy in expired:
            self.finish(copy, "expired")
        trimmed = [slot for slot, entry in self.dedupe.items() if entry[2] <= self.now]
        for slot in trimmed:
            del self.dedupe[slot]
        return {
            "released": released,
            "dead": dead,
            "expired": len(expired),
            "unblocked": 0,
            "dedupe_trimmed": len(trimmed),
            "processed_trimmed": 0,
            "results_trimmed": 0,
            "sagas_swept": 0,
            "archive_trimmed": 0,
            "dead_trimmed": 0,
        }

    def take_back_expired(self) -> tuple[int, int]:
        """The lease part of a reap, which ``Broker.claim`` also runs (at most once a
        second): spent leases die, other expired ones are released. ``(released, dead)``."""
        lapsed = [
            c
            for c in list(self.hot.values())
            if c.token is not None
            and c.lease_expires_at is not None
            and c.lease_expires_at <= self.now
        ]
        dead = released = 0
        for copy in lapsed:
            if copy.attempts >= copy.max_attempts:
                self.kill(copy, DEAD_WORKER_LOST)
                dead += 1
            else:
                copy.token = None
                copy.lease_expires_at = None
                released += 1
        return released, dead

    # --- what the database must show -------------------------------------------------------------

    def pending_view(self) -> dict[tuple[str, str], tuple[Any, ...]]:
        return {
            c.ident: (
                self.state(c),
                c.attempts,
                c.priority,
                c.key,
                c.available_at,
                c.expires_at,
                c.lease_expires_at,
            )
            for c in self.hot.values()
        }

    def stats_view(self) -> dict[str, tuple[Any, ...]]:
        names = set(self.subscriptions) | {sub for _, sub in self.dead}
        result = {}
        for name in sorted(names):
            mine = [c for c in self.hot.values() if c.subscription == name]
            states = [self.state(c) for c in mine]
            ready = [c.available_at for c, s in zip(mine, states, strict=True) if s == "available"]
            result[name] = (
                states.count("available"),
                states.count("scheduled"),
                states.count("running"),
                states.count("blocked"),
                sum(1 for (_, sub) in self.dead if sub == name),
                sum(
                    1
                    for (_, sub), done in self.archive.items()
                    if sub == name and done.outcome == "expired"
                ),
                None if not ready else self.now - min(ready),
            )
        return result

    def unrouted_total(self) -> int:
        return sum(1 for done in self.archive.values() if done.outcome == "unrouted")

    def accounted(self, published: Mapping[str, Iterable[str | None]]) -> list[str]:
        """Nothing lost: every copy ever published is in exactly one place. Returns problems."""
        problems = []
        for message_id, targets in published.items():
            for subscription in targets:
                places = 0
                if subscription is not None:
                    places += (message_id, subscription) in self.hot
                    places += (message_id, subscription) in self.dead
                places += (message_id, subscription) in self.archive
                if places != 1:
                    problems.append(f"{message_id}/{subscription} is in {places} places")
        return problems


def claim_order(copy: Copy) -> tuple[int, float, int]:
    """DESIGN §2.4: priority, then ``available_at``, then id (ids follow publish order)."""
    return (copy.priority, copy.available_at, copy.seq)


def allowed_claim(candidates: Sequence[Copy], limit: int) -> tuple[set[tuple[str, str]], int]:
    """The copies a claim of ``limit`` must return and how many more it may pick among ties.

    Returns ``(required, free)``: every copy strictly before the cut is required, and ``free``
    more come from the copies that tie with the cut on the sort key. The documented order
    breaks every tie by id, so ``free`` is 0 in practice; the check stays honest if a tie
    ever became legitimate.
    """
    if len(candidates) <= limit:
        return {c.ident for c in candidates}, 0
    boundary = claim_order(candidates[limit - 1])
    required = {c.ident for c in candidates if claim_order(c) < boundary}
    return required, limit - len(required)
