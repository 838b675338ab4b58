"""SqlBroker: a FastStream broker whose queues live in PostgreSQL or SQLite."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from fast_depends import Provider, dependency_provider
from faststream._internal.broker import BrokerUsecase
from faststream._internal.constants import EMPTY
from faststream._internal.context.repository import ContextRepo
from faststream._internal.di import FastDependsConfig
from faststream.middlewares import AckPolicy
from faststream.specification.schema import BrokerSpec

from sqlbroker import Message
from sqlbroker.features.subscribers import SubscriberSpec
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.url import parse_url

from .config import SqlBrokerConfig
from .connection import SqlConnection
from .logs import make_sql_logger_state
from .message import ErrorCapture
from .producer import SqlPublishCommand, publish_options
from .registrator import SqlRegistrator, seconds
from .subscriber import SqlSubscriber

if TYPE_CHECKING:
    from types import TracebackType

    from fast_depends.dependencies import Dependant
    from fast_depends.library.serializer import SerializerProto
    from faststream._internal.basic_types import LoggerProto, SendableMessage
    from faststream._internal.parser import CodecProto
    from faststream._internal.types import BrokerMiddleware, CustomCallable
    from faststream.security import BaseSecurity
    from faststream.specification.schema.extra import Tag, TagDict


def public_url(url: str) -> str:
    """``url`` without its password, for the AsyncAPI document."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}{port}"))


class SqlBroker(SqlRegistrator, BrokerUsecase[Message, SqlConnection, SqlBrokerConfig]):
    """A FastStream broker on sqlbroker: ``FastStream(SqlBroker("postgresql://…"))``.

    ``options`` are sqlbroker's ``Broker`` options (``migrate=True``, ``lease=…``,
    ``max_attempts=…``, …). ``graceful_timeout`` is the worker's grace period at stop;
    ``reap_interval``/``poll_interval``/``listen`` tune its reaper and wake-ups.
    """

    def __init__(
        self,
        url: str = "sqlite:///sqlbroker.db",
        *,
        graceful_timeout: float | None = 15.0,
        reap_interval: float = 5.0,
        poll_interval: float = 1.0,
        listen: bool = True,
        handler_timeout: float | timedelta | None = 300.0,
        ack_policy: AckPolicy = EMPTY,
        decoder: CustomCallable | None = None,
        parser: CustomCallable | None = None,
        codec: CodecProto | None = None,
        dependencies: Sequence[Dependant] = (),
        middlewares: Sequence[BrokerMiddleware[Any, Any]] = (),
        routers: Iterable[SqlRegistrator] = (),
        # AsyncAPI
        specification_url: str | None = None,
        description: str | None = None,
        tags: Iterable[Tag | TagDict] = (),
        security: BaseSecurity | None = None,
        # logging
        logger: LoggerProto | None = EMPTY,
        log_level: int = logging.INFO,
        # FastDepends
        apply_types: bool = True,
        serializer: SerializerProto | None = EMPTY,
        provider: Provider | None = None,
        context: ContextRepo | None = None,
        **options: Any,
    ) -> None:
        parse_url(url)  # a bad URL fails here, not at the first publish
        super().__init__(
            url=url,
            options=options,
            worker_options={
                "grace": 30.0 if graceful_timeout is None else graceful_timeout,
                "reap_interval": reap_interval,
                "poll_interval": poll_interval,
                "listen": listen,
            },
            routers=routers,
            config=SqlBrokerConfig(
                broker_middlewares=(ErrorCapture, *middlewares),
                broker_parser=parser,
                broker_decoder=decoder,
                broker_codec=codec,
                logger=make_sql_logger_state(logger=logger, log_level=log_level),
                fd_config=FastDependsConfig(
                    use_fastdepends=apply_types,
                    serializer=serializer,
                    provider=provider or dependency_provider,
                    context=context or ContextRepo(),
                ),
                broker_dependencies=dependencies,
                graceful_timeout=graceful_timeout,
                ack_policy=ack_policy,
                lease=seconds(options.get("lease")),
                timeout=seconds(handler_timeout),
                extra_context={"broker": self},
            ),
            specification=BrokerSpec(
                description=description,
                url=[specification_url or public_url(url)],
                protocol=urlsplit(url).scheme.split("+")[0] or "sqlite",
                protocol_version=None,
                tags=tags,
                security=security,
            ),
        )
        self.url = url

    async def _connect(self) -> SqlConnection:
        kwargs = self._connection_kwargs
        connection = await asyncio.to_thread(
            SqlConnection, kwargs["url"], kwargs["options"], kwargs["worker_options"]
        )
        try:
            await connection.declare(self._consumptions())
        except BaseException:
            await connection.close()
            raise
        self.config.connect(connection)
        return connection

    def _consumptions(self) -> list[SubscriberSpec]:
        """What the subscribers with handlers consume."""
        return [
            sub.consumption()
            for sub in self.subscribers
            if isinstance(sub, SqlSubscriber) and sub.calls
        ]

    async def start(self) -> None:
        """Connect, then run every subscriber with handlers in one sqlbroker worker."""
        connection = await self.connect()
        await super().start()
        consumptions = self._consumptions()
        if consumptions:
            connection.run(consumptions, dedicated=False)
        self.config.broker_config.started = True

    async def stop(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> None:
        """Stop gracefully: the workers finish running handlers (within
        ``graceful_timeout``), give back what they claimed and did not start, and flush
        every outcome; then the connections close."""
        connection = self._connection
        if connection is not None:
            for run in list(connection.runs):
                await connection.stop_run(run)
        await super().stop(exc_type, exc_val, exc_tb)
        if connection is not None:
            self._connection = None
            await connection.close()
        self.config.broker_config.disconnect()

    async def ping(self, timeout: float | None = None) -> bool:
        if self._connection is None:
            return False
        try:
            await asyncio.wait_for(self._connection.publisher.subscriptions(), timeout)
        except Exception:
            return False
        return True

    async def publish(
        self,
        message: SendableMessage = None,
        topic: str = "",
        *,
        conn: CallerConnection | None = None,
        headers: dict[str, str] | None = None,
        correlation_id: str | None = None,
        reply_to: str = "",
        key: str | None = None,
        replace: bool | None = None,
        debounce: float | timedelta | None = None,
        debounce_max: float | timedelta | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        at: Any = None,
        ttl: float | timedelta | None = None,
        expires_at: Any = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        dedupe_window: float | timedelta | None = None,
    ) -> str:
        """Publish ``message`` to ``topic`` and return its sqlbroker message id.

        ``conn=`` (a psycopg/sqlite3/SQLAlchemy/Django connection with an open
        transaction) writes the message in that transaction: it is delivered only if the
        caller commits. The other keywords are sqlbroker's publish options (``replace``,
        ``debounce`` and ``debounce_max``: docs/flow-control.md, "Debounce and replace")."""
        options = publish_options(locals())
        cmd = SqlPublishCommand(
            message,
            topic=topic,
            headers=headers,
            correlation_id=correlation_id or self.config.id_generator(),
            reply_to=reply_to,
            conn=conn,
            options=options,
        )
        result: str = await self._basic_publish(cmd, producer=self.config.producer)
        return result

    async def publish_batch(  # type: ignore[override]
        self,
        *messages: SendableMessage,
        topic: str = "",
        conn: CallerConnection | None = None,
        headers: dict[str, str] | None = None,
        correlation_id: str | None = None,
        key: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        ttl: float | timedelta | None = None,
        max_attempts: int | None = None,
    ) -> list[str]:
        """Publish ``messages`` to ``topic`` in one transaction (the caller's, with
        ``conn=``) and return their ids, in order."""
        if not messages:
            return []
        options = publish_options(locals())
        first, *rest = messages
        cmd = SqlPublishCommand(
            first,
            topic=topic,
            headers=headers,
            correlation_id=correlation_id or self.config.id_generator(),
            conn=conn,
            options=options,
            extra_bodies=tuple(rest),
        )
        result: list[str] = await self._basic_publish_batch(cmd, producer=self.config.producer)
        return result

    async def request(
        self, message: SendableMessage = None, topic: str = "", /, timeout: float = 0.5
    ) -> Any:
        return await self.config.producer.request(SqlPublishCommand(message, topic=topic))
