"""One handler call, and what a failed one becomes: the pump's decisions that need no state.

- :func:`call_handler` runs a handler under its subscriber's timeout: a coroutine function on
  the loop, a plain function on the handler threads with the caller's context;
- :func:`completion` turns a handler's return value into a complete that stores it;
- :func:`failure_outcome` turns a handler's exception into a retry or a dead letter: the
  subscriber's retry policy decides, and the retry is logged;
- :func:`report_dead_letter` logs a dead letter once it is written and runs the subscriber's
  ``on_dead_letter`` hook, whose failures are logged and never reach the worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Callable, Generator
from concurrent.futures import Executor
from types import CoroutineType
from typing import Any

from sqlbroker.core.errors import InvalidPayload
from sqlbroker.core.message import Delivery, ErrorInfo
from sqlbroker.core.serde import encode_value
from sqlbroker.core.settlements import Settlement
from sqlbroker.features.subscribers import SubscriberSpec
from sqlbroker.runtime.message import Message

log = logging.getLogger("sqlbroker.runtime")


class HandlerTimeout(Exception):
    """The handler ran longer than its subscriber's ``timeout``."""


class WorkerStopped(Exception):
    """The worker stopped at once while the handler was running."""


async def call_handler(spec: SubscriberSpec, threads: Executor, message: Message) -> Any:
    """Run the handler; return what it returned (awaited, if it returned an awaitable)."""
    handler = spec.handler
    if spec.is_async and spec.timeout is None:
        # No deadline: nothing to do between its steps, so the handler is simply awaited.
        result = handler(message)
        if type(result) is CoroutineType or inspect.isawaitable(result):
            return await result
        return result
    loop = asyncio.get_running_loop()
    deadline = None if spec.timeout is None else loop.time() + spec.timeout
    rest: _Resumed | None = None
    if spec.is_async:
        # A timeout can only strike where the handler waits: its first step runs with no
        # scope around it, and one that returns without waiting costs no scope and no
        # timer. The rest runs under the deadline from its start.
        result = handler(message)
        if not inspect.isawaitable(result):
            return result
        steps = result.__await__()
        try:
            waiting = steps.send(None)
        except StopIteration as done:
            return done.value
        rest = _Resumed(steps, waiting)
    scope = asyncio.timeout_at(deadline)
    try:
        async with scope:
            if rest is not None:
                return await rest
            context = contextvars.copy_context()
            result = await loop.run_in_executor(threads, context.run, handler, message)
            if inspect.isawaitable(result):
                result = await result
            return result
    except TimeoutError:
        if scope.expired():
            # A sync handler's thread cannot be stopped: it runs on, but its outcome no
            # longer counts.
            raise HandlerTimeout(
                f"the handler ran longer than its timeout of {spec.timeout:g} s"
            ) from None
        raise


class _Resumed:
    """Awaits the rest of an awaitable whose first step (``steps.send(None)``) yielded
    ``waiting``, as ``await`` would have gone on."""

    __slots__ = ("_steps", "_waiting")

    def __init__(self, steps: Generator[Any, Any, Any], waiting: Any) -> None:
        self._steps = steps
        self._waiting = waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        steps, waiting = self._steps, self._waiting
        while True:  # what ``yield from steps`` does, from its second step on
            try:
                sent = yield waiting
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as error:
                try:
                    waiting = steps.throw(error)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    waiting = steps.send(sent)
                except StopIteration as done:
                    return done.value


def completion(spec: SubscriberSpec, delivery: Delivery, value: Any, limit: int) -> Settlement:
    """A handler's outcome when it returned ``value`` (not ``None``, which stores nothing):
    complete, with the value encoded by the rules of a JSON payload. A value that cannot
    be stored — not JSON, or over ``limit`` bytes — dead-letters the copy at once: running
    the handler again would return it again."""
    try:
        return Settlement.complete(delivery, encode_value(value, limit=limit, field="result"))
    except InvalidPayload as error:
        log.error(
            "%s: the handler's return value for message %s cannot be stored: %s",
            spec.name,
            delivery.message_id,
            error,
            extra={"subscription": spec.name, "message_id": delivery.message_id},
        )
        return Settlement.dead(
            delivery,
            f"the handler's return value cannot be stored: {error}",
            ErrorInfo.from_exception(error),
        )


def failure_outcome(spec: SubscriberSpec, delivery: Delivery, error: BaseException) -> Settlement:
    settlement = spec.retry.decide(delivery, error)
    info = settlement.error
    if settlement.kind == "retry" and not settlement.snooze and info is not None:
        log.info(
            "%s attempt %d of message %s failed (%s: %s); retrying in %.2f s",
            spec.name,
            delivery.attempt,
            delivery.message_id,
            info.type,
            info.message,
            settlement.after,
            extra=_log_fields(delivery, error_type=info.type, retry_in=settlement.after),
        )
    return settlement


def _log_fields(delivery: Delivery, **more: Any) -> dict[str, Any]:
    """The ``extra`` of a log record about ``delivery``'s attempt, with ``more``."""
    return {
        "subscription": delivery.subscription,
        "message_id": delivery.message_id,
        "delivery_id": delivery.id,
        "attempt": delivery.attempt,
        **more,
    }


def report_dead_letter(
    spec: SubscriberSpec,
    delivery: Delivery,
    reason: str,
    threads: Executor,
    background: set[asyncio.Task[Any]],
) -> None:
    """Log the written dead letter and start the hook as a task kept in ``background``."""
    log.warning(
        "%s: message %s dead-lettered after %d attempt(s): %s",
        spec.name,
        delivery.message_id,
        delivery.attempt,
        reason,
        extra=_log_fields(delivery, reason=reason),
    )
    hook = spec.on_dead_letter
    if hook is not None:
        message = Message(delivery, threads=threads)
        task = asyncio.ensure_future(_run_hook(spec.name, hook, message, reason))
        background.add(task)
        task.add_done_callback(background.discard)


async def _run_hook(
    name: str, hook: Callable[[Any, str], Any], message: Message, reason: str
) -> None:
    try:
        if inspect.iscoroutinefunction(hook):
            await hook(message, reason)
        else:
            # A plain function may block (an alert, an HTTP call): keep it off the loop.
            result = await message._off_loop(hook, message, reason)
            if inspect.isawaitable(result):
                await result
    except Exception:
        log.exception("the on_dead_letter hook of %s failed", name)
