"""``AsyncBroker``: the same API as :class:`Broker`, awaitable.

Database calls run on a small dedicated thread pool (one thread per pooled connection), so
the event loop never blocks on I/O and SQLite keeps its one-connection-per-thread rule.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeVar

from sqlbroker.core import validate
from sqlbroker.core.flow import Flow
from sqlbroker.core.message import (
    NORMAL,
    ArchivedMessage,
    DeadLetter,
    Delivery,
    NewMessage,
    Outcome,
    PendingMessage,
    Retention,
    State,
    Subscription,
    SubscriptionStats,
)
from sqlbroker.core.results import Result
from sqlbroker.core.schedules import Schedule
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.processed import Once
from sqlbroker.features.publishing import build_batch, build_message, check_options
from sqlbroker.features.schedules import ScheduleRun
from sqlbroker.producer.broker import DEFAULT_URL, Broker
from sqlbroker.producer.consuming import (
    completions,
    delivery_list,
    raise_lost,
)
from sqlbroker.storage import caller
from sqlbroker.storage.backend import Backend

P = ParamSpec("P")
T = TypeVar("T")


def _materialized(items: Any) -> Any:
    """A batch read into a list on the caller's thread (a generator may not be thread-safe);
    anything that is not a plain iterable goes through as it is, for the broker to refuse
    with the same error as the sync API (a ``str`` is not a batch of characters)."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        return items
    return list(items)


class _Offloader:
    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sqlbroker-db")

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        # The caller's context goes along, so that a trace span current in the coroutine
        # is current in the thread that publishes.
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor, call)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class AsyncDeadLetters:
    """``async_broker.dead_letters``: awaitable twin of :class:`DeadLetters`."""

    def __init__(self, broker: Broker, offload: _Offloader) -> None:
        self._sync = broker.dead_letters
        self._offload = offload

    async def list(self, **filters: Any) -> list[DeadLetter]:
        return await self._offload.run(self._sync.list, **filters)

    async def get(self, id: int) -> DeadLetter:
        return await self._offload.run(self._sync.get, id)

    async def replay(self, ids: Iterable[int] | None = None, **filters: Any) -> builtins.list[int]:
        return await self._offload.run(self._sync.replay, ids, **filters)

    async def purge(self, ids: Iterable[int] | None = None, **filters: Any) -> int:
        return await self._offload.run(self._sync.purge, ids, **filters)


class AsyncOnce:
    """``async with broker.once(scope, key) as first:`` — :class:`~sqlbroker.Once` awaited."""

    def __init__(self, offload: _Offloader, make: Callable[[], Once]) -> None:
        self._offload = offload
        self._make = make
        self._once: Once | None = None

    async def __aenter__(self) -> bool:
        self._once = await self._offload.run(self._make)
        return await self._offload.run(self._once.__enter__)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._once is not None
        await self._offload.run(self._once.__exit__, kind, error, trace)

    async def extend(self, lease: float | timedelta | None = None) -> None:
        assert self._once is not None
        await self._offload.run(self._once.extend, lease)


class AsyncBroker:
    """The awaitable face of :class:`Broker`; same constructor, same methods."""

    def __init__(self, url: str = DEFAULT_URL, *, threads: int = 4, **options: Any) -> None:
        threads = validate.integer(threads, "threads", minimum=1, maximum=256)
        self.sync = Broker(url, **options)
        if self.sync.backend_name == "sqlite" and self.sync.in_memory:
            threads = 1
        self._offload = _Offloader(threads)
        self.dead_letters = AsyncDeadLetters(self.sync, self._offload)

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    @property
    def url(self) -> str:
        """The database URL with any password replaced by ``***``."""
        return self.sync.url

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """See :meth:`Broker.close`; also stops the threads that run the blocking calls."""
        await self._offload.run(self.sync.close)
        self._offload.shutdown()

    async def migrate(self) -> builtins.list[int]:
        """See :meth:`Broker.migrate`."""
        return await self._offload.run(self.sync.migrate)

    # A publish runs on this loop: PostgreSQL on the loop's async pool, SQLite on the
    # backend's own threads. With ``conn=`` it joins the caller's transaction: an async
    # connection (psycopg's AsyncConnection, SQLAlchemy's asyncio) is awaited here; a sync
    # one is used on the calling thread, where its owner uses it (sqlite3 connections
    # refuse other threads).

    async def publish(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | None = None,
        priority: int = NORMAL,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        ttl: float | timedelta | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        dedupe_window: float | timedelta | None = None,
        content_type: str | None = None,
        conn: Any = None,
    ) -> str:
        """See :meth:`Broker.publish`."""
        if conn is not None and not caller.is_async(conn):
            return self.sync.publish(
                topic,
                payload,
                key=key,
                priority=priority,
                delay=delay,
                at=at,
                ttl=ttl,
                expires_at=expires_at,
                max_attempts=max_attempts,
                headers=headers,
                idempotency_key=idempotency_key,
                dedupe_window=dedupe_window,
                content_type=content_type,
                conn=conn,
            )
        message = build_message(
            topic,
            payload,
            defaults=self.sync.publish_defaults,
            key=key,
            priority=priority,
            delay=delay,
            at=at,
            ttl=ttl,
            expires_at=expires_at,
            max_attempts=max_attempts,
            headers=headers,
            idempotency_key=idempotency_key,
            dedupe_window=dedupe_window,
            content_type=content_type,
        )
        return (await self._insert_async([message], None, conn))[0]

    async def publish_many(
        self, messages: Iterable[Mapping[str, Any]], *, conn: Any = None
    ) -> builtins.list[str]:
        """See :meth:`Broker.publish_many`."""
        if conn is not None and not caller.is_async(conn):
            return self.sync.publish_many(messages, conn=conn)
        batch = build_batch(messages, defaults=self.sync.publish_defaults)
        return await self._insert_async(batch, None, conn) if batch else []

    async def send(
        self,
        queue: str,
        payload: Any,
        *,
        key: str | None = None,
        priority: int = NORMAL,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        ttl: float | timedelta | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        dedupe_window: float | timedelta | None = None,
        content_type: str | None = None,
        conn: Any = None,
    ) -> str:
        """See :meth:`Broker.send`."""
        if conn is not None and not caller.is_async(conn):
            return self.sync.send(
                queue,
                payload,
                key=key,
                priority=priority,
                delay=delay,
                at=at,
                ttl=ttl,
                expires_at=expires_at,
                max_attempts=max_attempts,
                headers=headers,
                idempotency_key=idempotency_key,
                dedupe_window=dedupe_window,
                content_type=content_type,
                conn=conn,
            )
        validate_topic(queue, "queue")
        message = build_message(
            queue,
            payload,
            defaults=self.sync.publish_defaults,
            key=key,
            priority=priority,
            delay=delay,
            at=at,
            ttl=ttl,
            expires_at=expires_at,
            max_attempts=max_attempts,
            headers=headers,
            idempotency_key=idempotency_key,
            dedupe_window=dedupe_window,
            content_type=content_type,
        )
        return (await self._insert_async([message], queue, conn))[0]

    async def send_many(
        self, queue: str, payloads: Iterable[Any], *, conn: Any = None, **options: Any
    ) -> builtins.list[str]:
        """See :meth:`Broker.send_many`."""
        if conn is not None and not caller.is_async(conn):
            return self.sync.send_many(queue, payloads, conn=conn, **options)
        validate_topic(queue, "queue")
        check_options(options)
        batch = build_batch(
            payloads, defaults=self.sync.publish_defaults, topic=queue, options=options
        )
        return await self._insert_async(batch, queue, conn) if batch else []

    async def _backend(self) -> Backend:
        """The backend, its schema checked: the first call may migrate, on a thread."""
        ready = self.sync.ready_backend()
        if ready is not None:
            return ready
        return await self._offload.run(lambda: self.sync.backend)

    async def _insert_async(
        self, messages: builtins.list[NewMessage], queue: str | None, conn: Any
    ) -> builtins.list[str]:
        if conn is None:
            # On the broker's threads and its sync pool: an async pool belongs to one event
            # loop, and a caller that runs one loop per call (asyncio.run(broker.send(…)))
            # would leave a pool behind per call (issue 24: the async face's own pool).
            return await self._offload.run(self.sync.insert, messages, queue)
        messages = self.sync.with_hook_headers(messages)
        backend = await self._backend()
        async with backend.begin_async(conn) as tx:
            result = await tx.message_insert_many(
                messages=messages, subscription=queue, max_copies=self.sync.limits.max_copies
            )
        return result.message_ids

    def once(
        self,
        scope: str,
        key: str | int,
        *,
        lease: float | timedelta | None = None,
        window: float | timedelta | None = None,
    ) -> AsyncOnce:
        """See :meth:`Broker.once`."""
        return AsyncOnce(
            self._offload,
            functools.partial(self.sync.once, scope, key, lease=lease, window=window),
        )

    async def forget(self, scope: str, key: str | int) -> bool:
        """See :meth:`Broker.forget`."""
        return await self._offload.run(self.sync.forget, scope, key)

    async def subscribe(
        self, name: str, patterns: str | Sequence[str], *, replace: bool = False
    ) -> Subscription:
        """See :meth:`Broker.subscribe`."""
        return await self._offload.run(self.sync.subscribe, name, patterns, replace=replace)

    async def unsubscribe(self, name: str) -> bool:
        """See :meth:`Broker.unsubscribe`."""
        return await self._offload.run(self.sync.unsubscribe, name)

    async def subscriptions(self) -> builtins.list[Subscription]:
        """See :meth:`Broker.subscriptions`."""
        return await self._offload.run(self.sync.subscriptions)

    async def retention(self, subscription: str | None = None) -> builtins.list[Retention]:
        """See :meth:`Broker.retention`."""
        return await self._offload.run(self.sync.retention, subscription)

    async def set_retention(
        self,
        subscription: str,
        *,
        archive: float | timedelta | None = None,
        dead: float | timedelta | None = None,
        reset: bool = False,
    ) -> Retention:
        """See :meth:`Broker.set_retention`."""
        return await self._offload.run(
            self.sync.set_retention, subscription, archive=archive, dead=dead, reset=reset
        )

    async def pause(self, name: str, *, actor: str | None = None, note: str | None = None) -> None:
        """See :meth:`Broker.pause`."""
        await self._offload.run(self.sync.pause, name, actor=actor, note=note)

    async def resume(self, name: str, *, actor: str | None = None, note: str | None = None) -> None:
        """See :meth:`Broker.resume`."""
        await self._offload.run(self.sync.resume, name, actor=actor, note=note)

    async def flow(self, subscription: str | None = None) -> builtins.list[Flow]:
        """See :meth:`Broker.flow`."""
        return await self._offload.run(self.sync.flow, subscription)

    async def set_flow(self, subscription: str, *, reset: bool = False, **limits: object) -> Flow:
        """See :meth:`Broker.set_flow`."""
        return await self._offload.run(self.sync.set_flow, subscription, reset=reset, **limits)

    async def claim(
        self,
        subscription: str,
        *,
        limit: int = 1,
        lease: float | timedelta | None = None,
        worker: str | None = None,
    ) -> builtins.list[Delivery]:
        """See :meth:`Broker.claim`."""
        return await self._offload.run(
            self.sync.claim, subscription, limit=limit, lease=lease, worker=worker
        )

    async def complete(
        self, deliveries: Delivery | Iterable[Delivery], *, conn: Any = None, result: Any = None
    ) -> None:
        """See :meth:`Broker.complete`."""
        items = delivery_list(deliveries)
        if conn is None:
            await self._offload.run(self.sync.complete, items, result=result)
            return
        if not caller.is_async(conn):
            self.sync.complete(items, conn=conn, result=result)
            return
        values = self.sync.result_values(items, result)
        if not items:
            return
        backend = await self._backend()
        async with backend.begin_async(conn) as tx:
            done = await tx.message_settle_many(settlements=completions(items, values))
        raise_lost((d.id for d in items), done)

    async def retry(
        self,
        delivery: Delivery,
        *,
        after: float | timedelta = 0.0,
        error: BaseException | str | None = None,
    ) -> None:
        """See :meth:`Broker.retry`."""
        await self._offload.run(self.sync.retry, delivery, after=after, error=error)

    async def dead_letter(
        self, delivery: Delivery, *, reason: str, error: BaseException | str | None = None
    ) -> None:
        """See :meth:`Broker.dead_letter`."""
        await self._offload.run(self.sync.dead_letter, delivery, reason=reason, error=error)

    async def extend(
        self, delivery: Delivery, *, lease: float | timedelta | None = None
    ) -> datetime:
        """See :meth:`Broker.extend`."""
        return await self._offload.run(self.sync.extend, delivery, lease=lease)

    async def release(self, deliveries: Delivery | Iterable[Delivery]) -> None:
        """See :meth:`Broker.release`."""
        await self._offload.run(self.sync.release, delivery_list(deliveries))

    async def cancel(self, message_id: str) -> int:
        """See :meth:`Broker.cancel`."""
        return await self._offload.run(self.sync.cancel, message_id)

    async def reap(self, *, limit: int = 1000) -> dict[str, int]:
        """See :meth:`Broker.reap`."""
        return await self._offload.run(self.sync.reap, limit=limit)

    async def result(
        self,
        message_id: str,
        *,
        wait: float | timedelta = 0.0,
        subscription: str | None = None,
    ) -> Result | None:
        """See :meth:`Broker.result`: the wait sleeps on the event loop (lookups run on the
        database threads), and is cancelled with the calling task."""
        return await self.sync._results.get_async(
            message_id, wait=wait, subscription=subscription, run=self._offload.run
        )

    async def pending(
        self, subscription: str | None = None, *, state: State | str | None = None, limit: int = 100
    ) -> builtins.list[PendingMessage]:
        """See :meth:`Broker.pending`."""
        return await self._offload.run(self.sync.pending, subscription, state=state, limit=limit)

    async def archive(
        self,
        subscription: str | None = None,
        *,
        outcome: Outcome | str | None = None,
        message_id: str | None = None,
        limit: int = 100,
    ) -> builtins.list[ArchivedMessage]:
        """See :meth:`Broker.archive`."""
        return await self._offload.run(
            self.sync.archive, subscription, outcome=outcome, message_id=message_id, limit=limit
        )

    async def stats(self) -> builtins.list[SubscriptionStats]:
        """See :meth:`Broker.stats`."""
        return await self._offload.run(self.sync.stats)

    async def schedule(self, name: str, topic: str, payload: Any, **options: Any) -> Schedule:
        """See :meth:`Broker.schedule`."""
        return await self._offload.run(self.sync.schedule, name, topic, payload, **options)

    async def unschedule(self, name: str) -> bool:
        """See :meth:`Broker.unschedule`."""
        return await self._offload.run(self.sync.unschedule, name)

    async def schedules(self, names: Iterable[str] | None = None) -> builtins.list[Schedule]:
        """See :meth:`Broker.schedules`."""
        return await self._offload.run(self.sync.schedules, _materialized(names))

    async def pause_schedule(self, name: str) -> bool:
        """See :meth:`Broker.pause_schedule`."""
        return await self._offload.run(self.sync.pause_schedule, name)

    async def resume_schedule(self, name: str) -> bool:
        """See :meth:`Broker.resume_schedule`."""
        return await self._offload.run(self.sync.resume_schedule, name)

    async def run_due_schedules(self) -> ScheduleRun:
        """See :meth:`Broker.run_due_schedules`."""
        return await self._offload.run(self.sync.run_due_schedules)
