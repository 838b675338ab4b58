"""``@broker.subscriber`` and ``@broker.publisher`` for SqlBroker and SqlRouter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from faststream._internal.broker.registrator import Registrator
from faststream._internal.broker.router import ArgsContainer, BrokerRouter, SubscriberRoute
from faststream._internal.constants import EMPTY
from faststream.middlewares import AckPolicy

from sqlbroker import Message, RetryPolicy

from .config import SqlBrokerConfig
from .producer import publish_options
from .publisher import SqlPublisher, create_publisher
from .subscriber import SqlSubscriber, create_subscriber

if TYPE_CHECKING:
    from fast_depends.dependencies import Dependant
    from faststream._internal.parser import CodecProto
    from faststream._internal.types import BrokerMiddleware, CustomCallable


def seconds(value: float | timedelta | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


class SqlRegistrator(Registrator[Message, SqlBrokerConfig]):
    """Subscriber and publisher declarations (a broker's or a router's)."""

    def subscriber(  # type: ignore[override]
        self,
        topic: str | Sequence[str],
        *,
        group: str | None = None,
        ack_policy: AckPolicy = EMPTY,
        max_workers: int = 1,
        prefetch: int | None = None,
        lease: float | timedelta | None = None,
        timeout: float | timedelta | None = EMPTY,
        retry: RetryPolicy | None = None,
        no_reply: bool = False,
        dependencies: Sequence[Dependant] = (),
        parser: CustomCallable | None = None,
        decoder: CustomCallable | None = None,
        codec: CodecProto | None = None,
        persistent: bool = True,
        title: str | None = None,
        description: str | None = None,
        include_in_schema: bool = True,
    ) -> SqlSubscriber:
        """Consume ``topic``: without ``group``, the queue of that name (each message is
        handled once across all processes); with ``group="billing"``, the pub/sub
        subscription ``billing`` on the topic pattern(s) (``*`` one segment, ``#`` any):
        every group gets its own copy of each message.

        ``ack_policy`` (default ``NACK_ON_ERROR``): see the guide for the mapping onto
        sqlbroker's leases, retries and dead letters. ``max_workers`` handlers run at once
        per process; ``lease`` (seconds) is held before a crashed process's message is
        redelivered; ``timeout`` cancels a longer handler (a failure); ``retry`` is the
        :class:`sqlbroker.RetryPolicy` deciding nacks (default: backoff with full jitter,
        payloads failing validation dead-lettered at once).
        """
        topics = (topic,) if isinstance(topic, str) else tuple(topic)
        subscriber = create_subscriber(
            topics=topics,
            group=group,
            config=cast("SqlBrokerConfig", self.config),
            ack_policy=ack_policy,
            no_reply=no_reply,
            max_workers=max_workers,
            prefetch=prefetch,
            lease=seconds(lease),
            timeout=timeout if timeout is EMPTY else seconds(timeout),
            retry=retry,
            title_=title,
            description_=description,
            include_in_schema=include_in_schema,
        )
        super().subscriber(subscriber, persistent=persistent)
        return subscriber.add_call(
            parser_=parser or self._parser,
            decoder_=decoder or self._decoder,
            codec_=codec,
            dependencies_=dependencies,
        )

    def publisher(  # type: ignore[override]
        self,
        topic: str,
        *,
        headers: dict[str, str] | None = None,
        key: str | None = None,
        replace: bool | None = None,
        debounce: float | timedelta | None = None,
        debounce_max: float | timedelta | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        ttl: float | timedelta | None = None,
        max_attempts: int | None = None,
        persistent: bool = True,
        title: str | None = None,
        description: str | None = None,
        schema: Any | None = None,
        include_in_schema: bool = True,
    ) -> SqlPublisher:
        """A publisher to ``topic``; as a decorator of a handler it publishes the
        handler's return value. The sqlbroker options apply to every message it sends."""
        options = publish_options(locals())
        publisher = create_publisher(
            topic=topic,
            headers=headers,
            options=options,
            config=cast("SqlBrokerConfig", self.config),
            schema_=schema,
            title_=title,
            description_=description,
            include_in_schema=include_in_schema,
        )
        super().publisher(publisher, persistent=persistent)
        return publisher


class SqlRoute(SubscriberRoute):
    """A subscriber declared ahead for a :class:`SqlRouter` (``handlers=[…]``)."""


class SqlRoutePublisher(ArgsContainer):
    """A publisher declared ahead for a :class:`SqlRoute`."""


class SqlRouter(SqlRegistrator, BrokerRouter[Message, SqlBrokerConfig]):
    """Groups subscribers and publishers under a topic ``prefix``; include it in a
    :class:`SqlBroker` with ``broker.include_router(router)``."""

    def __init__(
        self,
        prefix: str = "",
        handlers: Iterable[SqlRoute] = (),
        *,
        dependencies: Sequence[Dependant] = (),
        middlewares: Sequence[BrokerMiddleware[Any]] = (),
        routers: Iterable[SqlRegistrator] = (),
        include_in_schema: bool | None = None,
    ) -> None:
        super().__init__(
            handlers=handlers,
            config=SqlBrokerConfig(
                prefix=prefix,
                include_in_schema=include_in_schema,
                broker_middlewares=middlewares,
                broker_dependencies=dependencies,
            ),
            routers=routers,
        )
