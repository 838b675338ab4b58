"""FastAPI integration: one broker per application, and an outbox bound to a request's
database session.

.. code-block:: python

    provider = BrokerProvider("postgresql://app@db/app")
    app = FastAPI(lifespan=provider.lifespan)

    @app.post("/orders")
    async def create_order(
        order: Order,
        session: AsyncSession = Depends(get_session),
        outbox: Outbox = Depends(provider.outbox(get_session)),
    ) -> dict[str, int]:
        session.add(OrderRow(**order.model_dump()))
        await outbox.publish("orders.created", order.model_dump())
        await session.commit()      # the order row and the message, together
        ...

``Depends(provider)`` gives the :class:`~sqlbroker.AsyncBroker` itself. FastAPI resolves a
dependency once per request, so ``outbox`` writes through the very session the endpoint
commits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Unpack

from fastapi import Depends

from sqlbroker.app import AsyncBroker
from sqlbroker.features.publishing import PublishOptions
from sqlbroker.storage.caller import CallerConnection


class Outbox:
    """Publishing bound to one caller connection or session (``conn=`` on every call)."""

    def __init__(self, broker: AsyncBroker, conn: CallerConnection) -> None:
        self.broker = broker
        self.conn = conn

    async def publish(self, topic: str, payload: Any, **options: Unpack[PublishOptions]) -> str:
        return await self.broker.publish(topic, payload, conn=self.conn, **options)

    async def publish_many(self, messages: Iterable[Mapping[str, Any]]) -> list[str]:
        return await self.broker.publish_many(messages, conn=self.conn)

    async def send(self, queue: str, payload: Any, **options: Unpack[PublishOptions]) -> str:
        return await self.broker.send(queue, payload, conn=self.conn, **options)


class BrokerProvider:
    """Owns an :class:`~sqlbroker.AsyncBroker` for the application's lifetime.

    The broker opens lazily on first use and closes when :attr:`lifespan` ends (pass it
    to ``FastAPI(lifespan=…)``, or enter it from your own lifespan).
    """

    def __init__(self, url: str, **options: Any) -> None:
        self._url = url
        self._options = options
        self._broker: AsyncBroker | None = None

    @property
    def broker(self) -> AsyncBroker:
        if self._broker is None:
            self._broker = AsyncBroker(self._url, **self._options)
        return self._broker

    async def __call__(self) -> AsyncBroker:
        return self.broker

    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        try:
            yield
        finally:
            broker, self._broker = self._broker, None
            if broker is not None:
                await broker.close()

    def outbox(
        self, connection: Callable[..., Any] | Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Outbox]]:
        """A dependency giving an :class:`Outbox` on what the ``connection`` dependency
        yields (an SQLAlchemy ``AsyncSession``/``Session``, a psycopg connection, …)."""

        async def dependency(conn: Any = Depends(connection)) -> Outbox:  # noqa: B008
            return Outbox(self.broker, conn)

        return dependency
