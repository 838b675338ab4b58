"""The broker state machine: random programs over the low-level API, checked step by step
against :class:`~properties.model.Model`.

Each example starts from an emptied database (same schema, no rows) and a fresh
``ManualClock`` at a whole second; time moves only by the ``advance`` rule, in whole seconds.
Every rule predicts its observable result from the model first, then calls the broker and
compares; after every step the invariants compare the whole database with the model.

Shrunk failures are kept as plain tests replaying the steps (see ``test_regressions.py``):
call the rule methods in order on ``BrokerMachine.for_url(url)()`` and end with
``teardown()``.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import sqlbroker
from helpers import table_counts
from properties.model import (
    DEAD_EXHAUSTED,
    DEAD_REJECTED,
    DEAD_WORKER_LOST,
    Model,
    PublishItem,
    PublishPlan,
    allowed_claim,
)
from sqlbroker.client.consuming import TAKE_BACK_EVERY

START = datetime(2030, 1, 1, tzinfo=UTC)
MAX_ATTEMPTS = 4
DEDUPE_WINDOW = 40
SUBSCRIPTIONS = {"all": ("ev.#",), "astar": ("ev.a.*",), "one": ("ev.*", "x.#")}
TOPICS = ["ev", "ev.a", "ev.b", "ev.a.x", "ev.a.x.y", "x", "nope", "q"]
CLAIMABLE = [*SUBSCRIPTIONS, "q"]
CONSUMERS = ["c1", "c2"]
ZOMBIES_KEPT = 30
EVERYTHING = 10_000
REJECT_REASON = "rejected by the state machine"

priorities = st.sampled_from([0, 2, 2, 9])
keys = st.sampled_from([None, None, "k1", "k2"])
delays = st.sampled_from([None, None, 0, 3, 10])
ttls = st.sampled_from([None, None, 5, 20, 60])
attempt_limits = st.sampled_from([None, 1, 2, 3])
idempotency_keys = st.sampled_from([None, None, "i1", "i2"])
windows = st.sampled_from([None, None, 5])
payloads = st.integers(0, 2)
indexes = st.integers(0, 63)


def empty_database(url: str, tables: list[str]) -> None:
    """Delete every row of the broker's tables (the schema and its version stay)."""
    statements = [f'DELETE FROM "{table}"' for table in tables]
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            for statement in statements:
                conn.execute(statement)
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in statements:
            conn.execute(statement.encode())


def seconds(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def dead_category(reason: str) -> str:
    if reason.startswith("max attempts exhausted"):
        return DEAD_EXHAUSTED
    if reason.startswith("worker lost"):
        return DEAD_WORKER_LOST
    assert reason == REJECT_REASON, reason
    return DEAD_REJECTED


class BrokerMachine(RuleBasedStateMachine):
    """Publish, claim, settle, move time, reap and kill, against the model."""

    url: ClassVar[str]
    tables: ClassVar[list[str] | None] = None

    @classmethod
    def for_url(cls, url: str) -> type[BrokerMachine]:
        return type(f"BrokerMachine_{url.split(':')[0]}", (cls,), {"url": url, "tables": None})

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        if cls.tables is None:
            with sqlbroker.Broker(self.url, migrate=True) as probe:
                cls.tables = sorted(table_counts(probe.backend))
        empty_database(self.url, cls.tables)
        self.clock = sqlbroker.ManualClock(START)
        self.broker = self._open()
        self.model = Model(
            now=START.timestamp(),
            default_max_attempts=MAX_ATTEMPTS,
            default_dedupe_window=DEDUPE_WINDOW,
        )
        for name, patterns in SUBSCRIPTIONS.items():
            self.broker.subscribe(name, list(patterns))
            self.model.subscribe(name, patterns)
        self.held: list[tuple[str, sqlbroker.Delivery]] = []
        self.zombies: list[sqlbroker.Delivery] = []
        self.published: dict[str, list[str | None]] = {}
        self.tokens: set[str] = set()
        self.taken_back_at: float | None = None

    def _open(self) -> sqlbroker.Broker:
        return sqlbroker.Broker(
            self.url,
            migrate=True,
            clock=self.clock,
            max_attempts=MAX_ATTEMPTS,
            dedupe_window=DEDUPE_WINDOW,
        )

    def teardown(self) -> None:
        self.broker.close()

    # --- publishing ----------------------------------------------------------------------------

    def _publish(self, items: list[PublishItem], call: Any) -> None:
        invalid = [
            i for i in items if i.ttl is not None and i.delay is not None and i.ttl <= i.delay
        ]
        if invalid:
            with pytest.raises(sqlbroker.InvalidDuration):
                call()
            return
        plan: PublishPlan = self.model.plan_publish(items)
        if plan.conflict:
            with pytest.raises(sqlbroker.IdempotencyConflict):
                call()
            return
        ids = call()
        assert len(ids) == len(items)
        fresh: set[str] = set()
        for index, (duplicate, message_id) in enumerate(zip(plan.duplicate_of, ids, strict=True)):
            if isinstance(duplicate, str):
                assert message_id == duplicate, f"item {index}: not the original id"
            elif isinstance(duplicate, int):
                assert message_id == ids[duplicate], f"item {index}: not the batch's first id"
            else:
                assert message_id not in self.published
                assert message_id not in fresh
                fresh.add(message_id)
        self.model.apply_publish(items, plan, ids)
        for item, duplicate, message_id in zip(items, plan.duplicate_of, ids, strict=True):
            if duplicate is None:
                self.published[message_id] = list(self.model.routes(item)) or [None]

    @staticmethod
    def _options(item: PublishItem) -> dict[str, Any]:
        options: dict[str, Any] = {"priority": item.priority}
        for name in ("key", "delay", "ttl", "max_attempts", "idempotency_key", "dedupe_window"):
            value = getattr(item, name)
            if value is not None:
                options[name] = value
        return options

    @rule(
        via=st.sampled_from(["publish", "send"]),
        topic=st.sampled_from(TOPICS),
        payload=payloads,
        priority=priorities,
        key=keys,
        delay=delays,
        ttl=ttls,
        max_attempts=attempt_limits,
        idempotency_key=idempotency_keys,
        dedupe_window=windows,
    )
    def publish(self, via: str, topic: str, payload: int, **options: Any) -> None:
        """``publish`` to a topic (fan-out), or ``send`` to the queue ``q``."""
        if via == "send":
            item = PublishItem("q", payload, queue="q", **options)
            self._publish([item], lambda: [self.broker.send("q", payload, **self._options(item))])
            return
        item = PublishItem(topic, payload, **options)
        self._publish([item], lambda: [self.broker.publish(topic, payload, **self._options(item))])

    @rule(
        via=st.sampled_from(["publish_many", "send_many"]),
        batch=st.lists(
            st.builds(
                PublishItem,
                topic=st.sampled_from(TOPICS),
                payload=payloads,
                priority=priorities,
                key=keys,
                delay=delays,
                ttl=ttls,
                idempotency_key=idempotency_keys,
            ),
            min_size=1,
            max_size=4,
        ),
    )
    def publish_batch(self, via: str, batch: list[PublishItem]) -> None:
        """``publish_many`` of mixed items, or ``send_many`` of their payloads with the
        first item's options."""
        if via == "send_many":
            first = batch[0]
            items = [
                PublishItem("q", i.payload, queue="q", key=first.key, delay=first.delay)
                for i in batch
            ]
            options = self._options(items[0])
            payload_list = [i.payload for i in items]
            self._publish(items, lambda: self.broker.send_many("q", payload_list, **options))
            return

        def call() -> list[str]:
            return self.broker.publish_many(
                [{"topic": i.topic, "payload": i.payload, **self._options(i)} for i in batch]
            )

        self._publish(batch, call)

    # --- consuming -----------------------------------------------------------------------------

    @rule(
        subscription=st.sampled_from(CLAIMABLE),
        limit=st.sampled_from([1, 2, 5]),
        lease=st.sampled_from([5, 30]),
        consumer=st.sampled_from(CONSUMERS),
    )
    def claim(self, subscription: str, limit: int, lease: int, consumer: str) -> None:
        self._claim(subscription, limit, lease, consumer)

    @rule(limit=st.sampled_from([1, 3]), consumer=st.sampled_from(CONSUMERS))
    def claim_everywhere(self, limit: int, consumer: str) -> None:
        """One consumer claims from every subscription in turn."""
        for subscription in CLAIMABLE:
            self._claim(subscription, limit, 10, consumer)

    def _claim(self, subscription: str, limit: int, lease: int, consumer: str) -> None:
        # A claim takes back expired leases first, at most once a second of its clock.
        if self.taken_back_at is None or self.model.now - self.taken_back_at >= TAKE_BACK_EVERY:
            self.taken_back_at = self.model.now
            self.model.take_back_expired()
        candidates = self.model.claimable(subscription)
        required, free = allowed_claim(candidates, limit)
        deliveries = self.broker.claim(subscription, limit=limit, lease=lease, worker=consumer)
        got = [(d.message_id, d.subscription) for d in deliveries]
        assert len(got) == len(set(got)), f"one claim returned a copy twice: {got}"
        assert len(got) == min(limit, len(candidates)), (got, [c.ident for c in candidates])
        assert required <= set(got), f"claim skipped {required - set(got)}"
        extra = set(got) - required
        assert len(extra) <= free
        allowed = {c.ident for c in candidates}
        assert extra <= allowed, f"claim returned copies it may not: {extra - allowed}"
        order = [(d.priority, d.available_at, d.id) for d in deliveries]
        assert order == sorted(order), "a claim's deliveries come most urgent first"
        now = self.model.now
        for delivery in deliveries:
            copy = self.model.hot[(delivery.message_id, delivery.subscription)]
            assert delivery.lease_token not in self.tokens, "a lease token was issued twice"
            self.tokens.add(delivery.lease_token)
            self.model.claimed(copy, delivery.lease_token, lease)
            assert delivery.topic == copy.topic
            assert delivery.payload == copy.payload
            assert delivery.priority == copy.priority
            assert delivery.key == copy.key
            assert delivery.attempt == copy.attempts
            assert delivery.max_attempts == copy.max_attempts
            assert delivery.available_at.timestamp() == copy.available_at
            assert seconds(delivery.expires_at) == copy.expires_at
            assert delivery.lease_expires_at.timestamp() == now + lease
            self.held.append((consumer, delivery))

    def _settled(self, delivery: sqlbroker.Delivery) -> None:
        self.held = [(c, d) for c, d in self.held if d is not delivery]
        self.zombies = [*self.zombies, delivery][-ZOMBIES_KEPT:]

    def _pick(self, index: int) -> sqlbroker.Delivery:
        return self.held[index % len(self.held)][1]

    def _holder(self, delivery: sqlbroker.Delivery) -> Any:
        return self.model.holder(delivery.message_id, delivery.subscription, delivery.lease_token)

    @precondition(lambda self: self.held)
    @rule(picks=st.lists(indexes, min_size=1, max_size=3))
    def complete(self, picks: list[int]) -> None:
        chosen = [self._pick(i) for i in picks]
        if self._complete(chosen):
            for delivery in chosen:
                self._settled(delivery)

    @precondition(lambda self: self.held and self.zombies)
    @rule(pick=indexes, zombie=indexes)
    def complete_with_a_zombie(self, pick: int, zombie: int) -> None:
        """One batch of a held delivery and an old one, perhaps of the same copy (a stale
        delivery and its re-claim)."""
        delivery = self._pick(pick)
        if self._complete([self.zombies[zombie % len(self.zombies)], delivery]):
            self._settled(delivery)

    def _complete(self, chosen: list[sqlbroker.Delivery]) -> bool:
        """Complete ``chosen`` as the model says; ``False`` when the call is refused."""
        if len({d.id for d in chosen}) < len(chosen):
            # Two deliveries of one copy (the same one twice, or a stale one and its
            # re-claim) are refused before any write: a refusal of the stale one could not
            # be told from the other's success.
            with pytest.raises(sqlbroker.InvalidOption):
                self.broker.complete(chosen)
            return False
        valid = {}
        for delivery in chosen:
            copy = self._holder(delivery)
            if copy is not None:
                valid[copy.ident] = (delivery.id, copy)
        done = {delivery_id for delivery_id, _ in valid.values()}
        lost = sorted({d.id for d in chosen} - done)
        if lost:
            with pytest.raises(sqlbroker.LeaseLost) as caught:
                self.broker.complete(chosen)
            assert list(caught.value.delivery_ids) == lost
        else:
            self.broker.complete(chosen)
        for _, copy in valid.values():
            self.model.finish(copy, "completed")
        return True

    def _retry(self, delivery: sqlbroker.Delivery, after: int) -> None:
        copy = self._holder(delivery)
        if copy is None:
            with pytest.raises(sqlbroker.LeaseLost):
                self.broker.retry(delivery, after=after)
            return
        self.broker.retry(delivery, after=after, error="try again")
        if delivery.attempt >= delivery.max_attempts:
            self.model.kill(copy, DEAD_EXHAUSTED)
        else:
            self.model.retried(copy, after)

    @precondition(lambda self: self.held)
    @rule(pick=indexes, after=st.sampled_from([0, 4]))
    def retry(self, pick: int, after: int) -> None:
        delivery = self._pick(pick)
        self._retry(delivery, after)
        self._settled(delivery)

    @precondition(lambda self: self.held)
    @rule(pick=indexes)
    def dead_letter(self, pick: int) -> None:
        delivery = self._pick(pick)
        copy = self._holder(delivery)
        if copy is None:
            with pytest.raises(sqlbroker.LeaseLost):
                self.broker.dead_letter(delivery, reason=REJECT_REASON)
        else:
            self.broker.dead_letter(delivery, reason=REJECT_REASON, error=ValueError("bad"))
            self.model.kill(copy, DEAD_REJECTED)
        self._settled(delivery)

    def _extend(self, delivery: sqlbroker.Delivery, lease: int) -> None:
        copy = self._holder(delivery)
        if copy is None:
            with pytest.raises(sqlbroker.LeaseLost):
                self.broker.extend(delivery, lease=lease)
            return
        until = self.broker.extend(delivery, lease=lease)
        assert until.timestamp() == self.model.now + lease
        copy.lease_expires_at = self.model.now + lease

    @precondition(lambda self: self.held)
    @rule(pick=indexes, lease=st.sampled_from([5, 30]))
    def extend(self, pick: int, lease: int) -> None:
        self._extend(self._pick(pick), lease)

    @precondition(lambda self: self.held)
    @rule(pick=indexes)
    def release(self, pick: int) -> None:
        delivery = self._pick(pick)
        copy = self._holder(delivery)
        if copy is None:
            with pytest.raises(sqlbroker.LeaseLost):
                self.broker.release(delivery)
        else:
            self.broker.release(delivery)
            self.model.released(copy)
        self._settled(delivery)

    @precondition(lambda self: self.zombies)
    @rule(pick=indexes, action=st.sampled_from(["complete", "retry", "extend"]))
    def zombie_settles(self, pick: int, action: str) -> None:
        """A consumer that was paused or written off comes back and settles an old
        delivery: it wins only if nobody took the lease over meanwhile."""
        delivery = self.zombies[pick % len(self.zombies)]
        if action == "complete":
            self._complete([delivery])
        elif action == "retry":
            self._retry(delivery, 0)
        else:
            self._extend(delivery, 5)

    @precondition(lambda self: self.published)
    @rule(pick=indexes)
    def cancel(self, pick: int) -> None:
        """Cancel a message (in one pick of four: a cancel ends a message's story early)."""
        if pick % 4:
            return
        # Insertion order, not sorted ids: ids carry random bits, and the step must be the
        # same on every replay of the example.
        message_ids = list(self.published)
        message_id = message_ids[pick % len(message_ids)]
        expected = self.model.cancel(message_id)
        assert self.broker.cancel(message_id) == expected

    # --- time, maintenance and failures --------------------------------------------------------

    @rule(by=st.sampled_from([1, 4, 5, 10, 30]))
    def advance(self, by: int) -> None:
        self.clock.advance(by)
        self.model.now += by

    @rule()
    def reap(self) -> None:
        expected = self.model.reap()
        assert self.broker.reap() == expected

    @precondition(lambda self: self.held)
    @rule(consumer=st.sampled_from(CONSUMERS))
    def kill(self, consumer: str) -> None:
        """The consumer vanishes: its deliveries are never settled (a reap or a later claim
        takes them back once their lease runs out)."""
        for owner, delivery in list(self.held):
            if owner == consumer:
                self._settled(delivery)

    @rule()
    def reopen(self) -> None:
        """The broker object is closed and a new one opened on the same database."""
        self.broker.close()
        self.broker = self._open()
        self.taken_back_at = None  # a new broker's first claim takes back at once

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def database_matches_the_model(self) -> None:
        broker, model = self.broker, self.model
        assert model.accounted(self.published) == []
        pending = {
            (p.message_id, p.subscription): (
                p.state.value,
                p.attempts,
                p.priority,
                p.key,
                p.available_at.timestamp(),
                seconds(p.expires_at),
                seconds(p.lease_expires_at),
            )
            for p in broker.pending(limit=EVERYTHING)
        }
        assert pending == model.pending_view()
        archive = {
            (a.message_id, a.subscription): (a.outcome.value, a.attempts)
            for a in broker.archive(limit=EVERYTHING)
        }
        expected_archive = {k: (v.outcome, v.attempts) for k, v in model.archive.items()}
        assert archive == expected_archive
        dead = {
            (d.message_id, d.subscription): (dead_category(d.reason), d.attempts)
            for d in broker.dead_letters.list(limit=EVERYTHING)
        }
        assert dead == {k: (v.outcome, v.attempts) for k, v in model.dead.items()}
        stats = {
            s.subscription: (
                s.ready,
                s.scheduled,
                s.running,
                s.blocked,
                s.dead,
                s.expired,
                s.oldest_ready_age,
            )
            for s in broker.stats()
        }
        expected_stats = model.stats_view()
        assert stats.keys() == expected_stats.keys()
        for name, row in stats.items():
            want = expected_stats[name]
            assert row[:-1] == want[:-1], name
            assert (row[-1] is None) == (want[-1] is None), name
            if row[-1] is not None:
                assert abs(row[-1] - want[-1]) < 1e-3, name
        assert broker.unrouted().total == model.unrouted_total()
