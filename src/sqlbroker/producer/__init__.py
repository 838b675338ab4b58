"""Layer 2: the faces users publish and administer through."""

from sqlbroker.producer.async_broker import AsyncBroker
from sqlbroker.producer.broker import Broker

__all__ = ["AsyncBroker", "Broker"]
