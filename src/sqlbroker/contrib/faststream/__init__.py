"""FastStream on sqlbroker: ``FastStream(SqlBroker("postgresql://…"))``.

The broker, its router, its message and its test client; docs/faststream.md is the guide
(the ack-policy mapping, what is kept of sqlbroker's guarantees and what is not).
"""

try:
    import faststream  # noqa: F401
except ImportError as missing:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "sqlbroker.contrib.faststream needs FastStream: pip install 'sqlbroker[faststream]'"
    ) from missing

from sqlbroker.contrib.faststream.broker import SqlBroker
from sqlbroker.contrib.faststream.message import SqlMessage
from sqlbroker.contrib.faststream.publisher import SqlPublisher
from sqlbroker.contrib.faststream.registrator import SqlRoute, SqlRoutePublisher, SqlRouter
from sqlbroker.contrib.faststream.subscriber import SqlSubscriber
from sqlbroker.contrib.faststream.testing import TestSqlBroker

__all__ = [
    "SqlBroker",
    "SqlMessage",
    "SqlPublisher",
    "SqlRoute",
    "SqlRoutePublisher",
    "SqlRouter",
    "SqlSubscriber",
    "TestSqlBroker",
]
