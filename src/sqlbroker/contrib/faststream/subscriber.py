"""FastStream subscribers consuming a sqlbroker subscription."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from fast_depends.exceptions import ValidationError as InjectionError
from faststream._internal.configs import (
    SubscriberSpecificationConfig,
    SubscriberUsecaseConfig,
)
from faststream._internal.constants import EMPTY
from faststream._internal.endpoint.publisher.fake import FakePublisher
from faststream._internal.endpoint.subscriber import SubscriberSpecification, SubscriberUsecase
from faststream._internal.endpoint.subscriber.call_item import CallsCollection
from faststream.exceptions import FeatureNotSupportedException, StopConsume
from faststream.middlewares import AckPolicy
from faststream.specification.asyncapi.utils import resolve_payloads
from faststream.specification.schema import Message as SpecMessage
from faststream.specification.schema import Operation, SubscriberSpec

from sqlbroker import Message, Retry, RetryPolicy
from sqlbroker.core.topics import validate_pattern, validate_topic
from sqlbroker.features.subscribers import SubscriberSpec as SqlbrokerSpec
from sqlbroker.features.subscribers import make_spec

from .config import SqlBrokerConfig
from .connection import WorkerRun
from .message import SqlMessage, decode, make_parser
from .producer import SqlPublishCommand

if TYPE_CHECKING:
    from faststream._internal.endpoint.publisher import PublisherProto
    from faststream.message import StreamMessage
    from faststream.response import PublishCommand


def default_retry() -> RetryPolicy:
    """Retries with sqlbroker's backoff; a payload that fails validation (FastStream's
    pydantic/fast-depends check of the handler's signature) is dead-lettered at once, since
    no retry can fix it."""
    errors: tuple[type[BaseException], ...] = (InjectionError,)
    try:
        from pydantic import ValidationError as PydanticError
    except ImportError:  # pragma: no cover - FastStream installs pydantic in practice
        pass
    else:
        errors = (*errors, PydanticError)
    return RetryPolicy(dead_on=errors)


@dataclass(kw_only=True)
class SqlSubscriberSpecificationConfig(SubscriberSpecificationConfig):
    topics: tuple[str, ...]
    group: str | None = None


@dataclass(kw_only=True)
class SqlSubscriberConfig(SubscriberUsecaseConfig):
    _outer_config: SqlBrokerConfig = field(default_factory=SqlBrokerConfig)
    topics: tuple[str, ...]
    group: str | None
    max_workers: int
    prefetch: int | None
    lease: float | None
    timeout: float | None
    retry: RetryPolicy

    @property
    def ack_policy(self) -> AckPolicy:
        if self._ack_policy is EMPTY:
            outer = self._outer_config.ack_policy
            return AckPolicy.NACK_ON_ERROR if outer is EMPTY else outer
        return self._ack_policy


class SqlSubscriberSpecification(
    SubscriberSpecification[SqlBrokerConfig, SqlSubscriberSpecificationConfig]
):
    @property
    def topics(self) -> list[str]:
        prefix = self._outer_config.prefix
        return [f"{prefix}{topic}" for topic in self.config.topics]

    @property
    def channel_labels(self) -> list[str]:
        return self.topics

    def get_schema(self) -> dict[str, SubscriberSpec]:
        payloads = self.get_payloads()
        topics = self.topics
        split = len(topics) > 1
        return {
            self._channel_key(topic, split=split): SubscriberSpec(
                address=topic,
                description=self.description,
                operation=Operation(
                    message=SpecMessage(
                        title=f"{self._channel_key(topic, split=split)}:Message",
                        payload=resolve_payloads(payloads),
                    ),
                    bindings=None,
                ),
                bindings=None,
            )
            for topic in topics
        }


class SqlReplyPublisher(FakePublisher):
    """Publishes a handler's return value to the message's ``reply_to`` topic."""

    def __init__(self, producer: Any, topic: str) -> None:
        super().__init__(producer=producer)
        self.topic = topic

    def patch_command(self, cmd: PublishCommand) -> SqlPublishCommand:
        cmd = super().patch_command(cmd)
        real = SqlPublishCommand.from_cmd(cmd)
        real.destination = self.topic
        return real


class SqlSubscriber(SubscriberUsecase[Message]):
    """Consumes one sqlbroker subscription: the queue named after its topic, or (with a
    ``group``) a pub/sub subscription of that name on the topic patterns."""

    _outer_config: SqlBrokerConfig

    def __init__(
        self,
        config: SqlSubscriberConfig,
        specification: SqlSubscriberSpecification,
        calls: CallsCollection[Message],
    ) -> None:
        config.parser = make_parser(config.retry)
        config.decoder = decode
        super().__init__(config, cast("SubscriberSpecification", specification), calls)
        self._topics = config.topics
        self.group = config.group
        self._sql_config = config
        self._run: WorkerRun | None = None

    @property
    def topics(self) -> tuple[str, ...]:
        prefix = self._outer_config.prefix
        return tuple(f"{prefix}{topic}" for topic in self._topics)

    @property
    def name(self) -> str:
        """The sqlbroker subscription this subscriber consumes."""
        return self.group or self.topics[0]

    def consumption(self) -> SqlbrokerSpec:
        """The ``ack="manual"`` sqlbroker subscriber that runs this one's handlers."""
        config, defaults = self._sql_config, self._outer_config
        name = validate_topic(self.name, "group" if self.group else "topic")
        patterns = [validate_pattern(t, "topic") for t in self.topics]
        return make_spec(
            self._on_message,
            name=name if self.group else None,
            topics=patterns if self.group else None,
            queue=None if self.group else name,
            concurrency=config.max_workers,
            prefetch=config.prefetch,
            lease=config.lease if config.lease is not None else defaults.lease,
            timeout=config.timeout if config.timeout is not EMPTY else defaults.timeout,
            retry=config.retry,
            ack="manual",
        )

    async def _on_message(self, raw: Message) -> None:
        """The sqlbroker handler: FastStream processes the message, and its ack policy
        settles it through :class:`SqlMessage`. An error that left it unsettled (under
        ``MANUAL``, or when the settlement itself failed) goes back to the worker, whose
        retry policy decides, instead of holding the lease until the process stops."""
        if not self.running:
            # Stopped while the shared worker runs on: give the message back unspent.
            raise Retry(0.0, "the FastStream subscriber is stopped")
        try:
            await self.process_message(raw)
        except StopConsume:
            await self.stop()
        except SystemExit:
            await self.stop()
            if app := self._outer_config.context.get("app"):
                app.exit()
        except Exception:
            # Logged by FastStream's middleware already.
            if not raw.settled:
                raise

    async def start(self) -> None:
        await super().start()
        config = self._outer_config
        if self.calls and config.started:
            # Started on its own while the broker runs: a worker of its own.
            connection = config.connection
            consumption = self.consumption()
            await connection.declare([consumption])
            self._run = connection.run([consumption], dedicated=True)
        self._post_start()

    async def stop(self) -> None:
        self.running = False
        run, self._run = self._run, None
        if run is not None:
            await self._outer_config.connection.stop_run(run)
        await super().stop()

    def _make_response_publisher(self, message: StreamMessage[Any]) -> Sequence[PublisherProto]:
        return (SqlReplyPublisher(self._outer_config.producer, message.reply_to),)

    def get_log_context(self, message: StreamMessage[Any] | None) -> dict[str, str]:
        return {
            "topic": ",".join(self.topics),
            "message_id": getattr(message, "message_id", ""),
        }

    async def get_one(self, *, timeout: float = 5.0) -> SqlMessage | None:
        raise FeatureNotSupportedException(
            "SqlBroker subscribers consume through their handler; use sqlbroker's "
            "broker.claim() for one-off reads"
        )

    async def __aiter__(self) -> AsyncIterator[SqlMessage]:
        raise FeatureNotSupportedException("SqlBroker subscribers cannot be iterated")
        yield  # pragma: no cover
