"""FastStream publishers writing to a sqlbroker topic."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from faststream._internal.configs import PublisherSpecificationConfig, PublisherUsecaseConfig
from faststream._internal.endpoint.publisher import PublisherSpecification, PublisherUsecase
from faststream.exceptions import FeatureNotSupportedException
from faststream.specification.asyncapi.utils import resolve_payloads
from faststream.specification.schema import Message as SpecMessage
from faststream.specification.schema import Operation, PublisherSpec

from sqlbroker.storage.caller import CallerConnection

from .config import SqlBrokerConfig
from .producer import SqlPublishCommand

if TYPE_CHECKING:
    from faststream._internal.basic_types import SendableMessage
    from faststream._internal.types import PublisherMiddleware
    from faststream.response import PublishCommand


@dataclass(kw_only=True)
class SqlPublisherSpecificationConfig(PublisherSpecificationConfig):
    topic: str


@dataclass(kw_only=True)
class SqlPublisherConfig(PublisherUsecaseConfig):
    _outer_config: SqlBrokerConfig = field(default_factory=SqlBrokerConfig)
    topic: str
    headers: dict[str, str] | None
    options: dict[str, Any]


class SqlPublisherSpecification(
    PublisherSpecification[SqlBrokerConfig, SqlPublisherSpecificationConfig]
):
    @property
    def topic(self) -> str:
        return f"{self._outer_config.prefix}{self.config.topic}"

    @property
    def name(self) -> str:
        return self.config.title_ or f"{self.topic}:Publisher"

    def get_schema(self) -> dict[str, PublisherSpec]:
        payloads = self.get_payloads()
        return {
            self.name: PublisherSpec(
                address=self.topic,
                description=self.config.description_,
                operation=Operation(
                    message=SpecMessage(
                        title=f"{self.name}:Message",
                        payload=resolve_payloads(payloads, "Publisher"),
                    ),
                    bindings=None,
                ),
                bindings=None,
            )
        }


class SqlPublisher(PublisherUsecase):
    """Publishes to one sqlbroker topic; as a decorator, publishes the handler's result."""

    _outer_config: SqlBrokerConfig

    def __init__(self, config: SqlPublisherConfig, specification: SqlPublisherSpecification):
        super().__init__(config, cast("PublisherSpecification", specification))
        self._topic = config.topic
        self.headers = config.headers or {}
        self.options = config.options

    @property
    def topic(self) -> str:
        return f"{self._outer_config.prefix}{self._topic}"

    async def publish(
        self,
        message: SendableMessage,
        topic: str = "",
        *,
        headers: dict[str, str] | None = None,
        correlation_id: str | None = None,
        reply_to: str = "",
        conn: CallerConnection | None = None,
        **options: Any,
    ) -> str:
        """Publish ``message``; ``conn=`` joins the caller's open transaction, and the
        other keywords are sqlbroker's publish options (``key``, ``priority``, ``delay``,
        ``ttl``, ``idempotency_key``, …)."""
        cmd = SqlPublishCommand(
            message,
            topic=topic or self.topic,
            headers=self.headers | (headers or {}),
            correlation_id=correlation_id or self._outer_config.id_generator(),
            reply_to=reply_to,
            conn=conn,
            options=self.options | options,
        )
        result: str = await self._basic_publish(
            cmd, producer=self._outer_config.producer, _extra_middlewares=()
        )
        return result

    async def _publish(
        self, cmd: PublishCommand, *, _extra_middlewares: Iterable[PublisherMiddleware]
    ) -> None:
        """Called in a subscriber's flow: publishes the handler's result."""
        real = SqlPublishCommand.from_cmd(cmd)
        real.destination = real.destination or self.topic
        real.add_headers(self.headers, override=False)
        real.options = self.options | real.options
        await self._basic_publish(
            real, producer=self._outer_config.producer, _extra_middlewares=_extra_middlewares
        )

    async def request(self, message: SendableMessage, topic: str = "", **kwargs: Any) -> Any:
        raise FeatureNotSupportedException("SqlBroker does not support request/reply (RPC)")
