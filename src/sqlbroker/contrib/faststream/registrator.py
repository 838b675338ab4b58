"""``@broker.subscriber`` and ``@broker.publisher`` for SqlBroker and SqlRouter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from faststream._internal.broker.registrator import Registrator
from faststream._internal.broker.router import ArgsContainer, BrokerRouter, SubscriberRoute
from faststream._internal.constants import EMPTY
from faststream._internal.endpoint.subscriber.call_item import CallsCollection
from faststream.middlewares import AckPolicy

from sqlbroker import InvalidOption, Message, RetryPolicy
from sqlbroker.core.topics import is_wildcard, validate_pattern, validate_topic

from .config import SqlBrokerConfig
from .producer import publish_options
from .publisher import (
    SqlPublisher,
    SqlPublisherConfig,
    SqlPublisherSpecification,
    SqlPublisherSpecificationConfig,
)
from .subscriber import (
    SqlSubscriber,
    SqlSubscriberConfig,
    SqlSubscriberSpecification,
    SqlSubscriberSpecificationConfig,
    default_retry,
)

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
        if not topics:
            raise InvalidOption("topic", "give the topic (or topic patterns) to consume")
        for pattern in topics:
            validate_pattern(pattern, "topic")
        if group is None:
            if len(topics) > 1 or is_wildcard(topics[0]):
                raise InvalidOption(
                    "group",
                    "several topics or a wildcard need group=NAME (the subscription's name)",
                )
        else:
            validate_topic(group, "group")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidOption("retry", "must be a sqlbroker RetryPolicy")
        if not isinstance(max_workers, int) or max_workers < 1:
            raise InvalidOption("max_workers", "must be a positive integer")
        config = cast("SqlBrokerConfig", self.config)
        calls = CallsCollection[Any]()
        subscriber = SqlSubscriber(
            SqlSubscriberConfig(
                topics=topics,
                group=group,
                max_workers=max_workers,
                prefetch=prefetch,
                lease=seconds(lease),
                timeout=timeout if timeout is EMPTY else seconds(timeout),
                retry=retry or default_retry(),
                no_reply=no_reply,
                _outer_config=config,
                _ack_policy=ack_policy,
            ),
            SqlSubscriberSpecification(
                config,
                SqlSubscriberSpecificationConfig(
                    topics=topics,
                    group=group,
                    title_=title,
                    description_=description,
                    include_in_schema=include_in_schema,
                ),
                calls,
            ),
            calls,
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
        validate_topic(topic, "topic")
        config = cast("SqlBrokerConfig", self.config)
        publisher = SqlPublisher(
            SqlPublisherConfig(topic=topic, headers=headers, options=options, _outer_config=config),
            SqlPublisherSpecification(
                config,
                SqlPublisherSpecificationConfig(
                    topic=topic,
                    schema_=schema,
                    title_=title,
                    description_=description,
                    include_in_schema=include_in_schema,
                ),
            ),
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
