"""The FastStream broker configuration of a SqlBroker: its connection and producer."""

from __future__ import annotations

from dataclasses import dataclass, field

from faststream._internal.configs import BrokerConfig
from faststream._internal.parser import DefaultCodec

from .connection import SqlConnection
from .producer import SqlProducer


@dataclass(kw_only=True)
class SqlBrokerConfig(BrokerConfig):
    producer: SqlProducer = field(default_factory=lambda: SqlProducer(DefaultCodec()))
    lease: float | None = None
    timeout: float | None = 300.0
    started: bool = field(default=False, init=False)

    @property
    def connection(self) -> SqlConnection:
        """The producer's connection (``IncorrectState`` before ``connect()``)."""
        return self.producer.connection

    def connect(self, connection: SqlConnection) -> None:
        self.producer.connect(connection, self.fd_config._serializer)
        self.producer.codec = self.broker_codec or DefaultCodec()

    def disconnect(self) -> None:
        self.started = False
        self.producer.disconnect()
