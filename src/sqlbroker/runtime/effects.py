"""Exactly-once effects: a handler's writes and its message's ack in one transaction.

``with msg.transaction() as conn:`` (or ``async with``) opens a transaction on the broker's
database and hands the handler the driver connection. When the block ends normally the
message is completed *inside that transaction* — if its lease is still ours — and then it
commits: the handler's rows and the ack land together or not at all. A redelivery after
any crash therefore finds the effect either done and acknowledged, or not done.

If the lease was lost (the handler outlived it, another worker has the message now),
nothing commits and ``LeaseLost`` is raised. If the commit itself fails with an ambiguous
``ConnectionLost`` the message is left to the retry policy: its redelivery (when the commit
did not happen) or a lost lease on the write-back (when it did) sorts it out.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlbroker.core.errors import LeaseLost, SqlbrokerError
from sqlbroker.core.settlements import Settlement
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.seam import AsyncTx, Tx

if TYPE_CHECKING:
    from sqlbroker.runtime.message import Message


class EffectsTransaction:
    """The context manager :meth:`Message.transaction` returns; usable once, with ``with``
    from a plain-function handler or ``async with`` from a coroutine."""

    def __init__(
        self,
        backend: Backend,
        message: Message,
        *,
        committed: Callable[[], None],
    ) -> None:
        self._backend = backend
        self._delivery = message.delivery
        self._claim = message._begin_settling
        self._unclaim = message._abort_settling
        self._committed = committed
        self._sync: AbstractContextManager[Tx] | None = None
        self._async: AbstractAsyncContextManager[AsyncTx] | None = None
        self._tx: Tx | None = None
        self._async_tx: AsyncTx | None = None

    # --- sync ----------------------------------------------------------------------------

    def __enter__(self) -> Any:
        self._start()
        try:
            # The handler's own statements run in it: never cut for taking long.
            self._sync = self._backend.begin(timed=False)
            self._tx = self._sync.__enter__()
        except BaseException:
            self._unclaim()
            raise
        return self._tx.connection

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool:
        assert self._sync is not None
        assert self._tx is not None
        if kind is not None:
            self._unclaim()
            return bool(self._sync.__exit__(kind, error, trace))
        try:
            done = self._tx.message_settle_many(settlements=[self._settlement()])
            if not done:
                raise LeaseLost([self._delivery.id])
        except BaseException as failure:
            self._unclaim()
            self._sync.__exit__(type(failure), failure, failure.__traceback__)
            raise
        try:
            self._sync.__exit__(None, None, None)
        except BaseException:
            self._unclaim()
            raise
        self._committed()
        return False

    def _settlement(self) -> Settlement:
        return Settlement.complete(self._delivery)

    # --- async ---------------------------------------------------------------------------

    async def __aenter__(self) -> Any:
        self._start()
        try:
            self._async = self._backend.begin_async(timed=False)
            self._async_tx = await self._async.__aenter__()
        except BaseException:
            self._unclaim()
            raise
        return self._async_tx.connection

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool:
        assert self._async is not None
        assert self._async_tx is not None
        if kind is not None:
            self._unclaim()
            return bool(await self._async.__aexit__(kind, error, trace))
        try:
            done = await self._async_tx.message_settle_many(settlements=[self._settlement()])
            if not done:
                raise LeaseLost([self._delivery.id])
        except BaseException as failure:
            self._unclaim()
            await self._async.__aexit__(type(failure), failure, failure.__traceback__)
            raise
        try:
            await self._async.__aexit__(None, None, None)
        except BaseException:
            self._unclaim()
            raise
        self._committed()
        return False

    # --- shared --------------------------------------------------------------------------

    def _start(self) -> None:
        if self._sync is not None or self._async is not None:
            raise SqlbrokerError("a message's transaction can be entered only once")
        self._claim()
