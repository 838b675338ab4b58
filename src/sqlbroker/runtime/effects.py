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

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlbroker.core.errors import LeaseLost, SqlbrokerError
from sqlbroker.core.settlements import Settlement
from sqlbroker.storage.backend import Backend

if TYPE_CHECKING:
    from sqlbroker.runtime.message import Message


class EffectsTransaction:
    """The context manager :meth:`Message.transaction` returns; usable once, with ``with``
    from a plain-function handler or ``async with`` from a coroutine."""

    _sync: AbstractContextManager[Any]  # the block's transaction, once entered
    _async: AbstractAsyncContextManager[Any]

    def __init__(
        self, backend: Backend, message: Message, *, committed: Callable[[], None]
    ) -> None:
        self._backend = backend
        self._message = message
        self._committed = committed
        self._entered = False

    def __enter__(self) -> Any:
        self._sync = self._run()
        return self._sync.__enter__()

    def __exit__(self, *exc_info: Any) -> bool | None:
        return self._sync.__exit__(*exc_info)

    async def __aenter__(self) -> Any:
        self._async = self._run_async()
        return await self._async.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._async.__aexit__(*exc_info)

    # The handler's own statements run in the transaction: never cut for taking long.
    # Whatever fails in it (the block, the ack, the commit) rolls back and leaves the
    # message unsettled; a completed commit settled it.

    @contextlib.contextmanager
    def _run(self) -> Iterator[Any]:
        with self._settling() as done, self._backend.begin(timed=False) as tx:
            yield tx.connection
            if not tx.message_settle_many(settlements=[done]):
                raise LeaseLost([done.lease.id])

    @contextlib.asynccontextmanager
    async def _run_async(self) -> AsyncIterator[Any]:
        with self._settling() as done:
            async with self._backend.begin_async(timed=False) as tx:
                yield tx.connection
                if not await tx.message_settle_many(settlements=[done]):
                    raise LeaseLost([done.lease.id])

    @contextlib.contextmanager
    def _settling(self) -> Iterator[Settlement]:
        """Claim the message's settlement for the transaction inside, whose commit
        completes it (the complete is yielded; then the message is settled and ``committed``
        called); hand it back if that fails."""
        if self._entered:
            raise SqlbrokerError("a message's transaction can be entered only once")
        self._message._begin_settling()
        self._entered = True
        try:
            yield Settlement.complete(self._message.delivery)
        except BaseException:
            self._message._abort_settling()
            raise
        self._message._end_settling()
        self._committed()
