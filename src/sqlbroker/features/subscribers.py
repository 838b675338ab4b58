"""Subscriber declarations: what a worker consumes and how, validated up front.

``@broker.subscriber(...)`` builds a :class:`SubscriberSpec`; the runtime turns each spec
into a pump. Nothing here runs handlers or touches the database.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypedDict, Unpack

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.flow import FLOW_OPTIONS, FlowLimits, Rate, flow_limits
from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.topics import validate_patterns, validate_topic

AckMode = Literal["auto", "manual"]
Handler = Callable[[Any], Any]
DeadLetterHook = Callable[[Any, str], Any]

DEFAULT_CONCURRENCY = 10
DEFAULT_TIMEOUT = 300.0


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` function, or an object
    whose ``__call__`` is one (a handler, a saga step)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
    )


@dataclass(frozen=True)
class SubscriberSpec:
    """One subscription's consumer.

    ``topics`` makes it a pub/sub subscription named ``name`` with those patterns; ``queue``
    makes it the point-to-point consumer of that queue (``name`` defaults to the queue).
    """

    name: str
    handler: Handler
    patterns: tuple[str, ...]
    is_queue: bool
    concurrency: int
    prefetch: int | None
    """Extra claims ahead of free slots; ``None`` lets the pump size it (see runtime.fetching)."""
    lease: float | None
    timeout: float | None
    retry: RetryPolicy
    ack: AckMode
    on_dead_letter: DeadLetterHook | None
    flow: FlowLimits | None = None
    """The subscription's flow limits, set when the worker starts (``None``: the worker
    leaves those the subscription has, e.g. set with ``sqlbroker flow``)."""

    @functools.cached_property  # asked per message by the worker
    def is_async(self) -> bool:
        return is_async_callable(self.handler)


class SubscriberOptions(TypedDict, total=False):
    """How a subscriber consumes: the keywords of ``@broker.subscriber`` besides ``name``,
    every one optional, its default in its description. Give exactly one of ``topics``
    and ``queue``."""

    topics: Sequence[str] | str | None
    """Topic patterns: a pub/sub subscription named ``name`` (default: the function's
    name)."""
    queue: str | None
    """A queue's name: its point-to-point consumer."""
    concurrency: int
    """Handlers running at once in each worker process (default 10); plain functions run
    in a thread pool, never on the event loop."""
    prefetch: int | None
    """Extra messages claimed ahead of free slots, so that the next batch is at hand when
    handlers finish. By default the worker sizes it from the handler's recent run time: as
    many as finish within about 50 ms on the free slots, at least the concurrency and at
    most 100, so fast handlers get one claim per batch and slow ones hold no more leases
    than they can start soon."""
    lease: float | timedelta | None
    """Seconds a claim is held before redelivery, kept alive while the handler runs
    (default: the broker's)."""
    timeout: float | timedelta | None
    """A handler running longer is cancelled and counts as failed (default 300 s;
    ``None`` for no limit)."""
    retry: RetryPolicy | None
    """The :class:`RetryPolicy` (default: the message's max attempts, 1 s exponential
    backoff with full jitter, capped at 300 s)."""
    ack: AckMode
    """``"auto"`` (default) settles from the handler's result; ``"manual"`` leaves it to
    ``msg.ack()``, ``msg.nack(after=…)`` or ``msg.reject(reason)``."""
    on_dead_letter: DeadLetterHook | None
    """``on_dead_letter(msg, reason)`` is called after a message was dead-lettered."""
    max_running: int | None
    """Flow limit (docs/flow-control.md): copies running at once across every worker and
    host. When any flow limit is given the worker sets exactly these at start (the others
    off); with none it leaves the subscription's own (``Broker.set_flow``,
    ``sqlbroker flow``)."""
    key_concurrency: int | None
    """Flow limit: copies running at once per ordering key."""
    rate_limit: str | Rate | None
    """Flow limit: claims per period (``"100/min"``)."""
    key_rate_limit: str | Rate | None
    """Flow limit: claims per period and ordering key."""
    fair: bool | None
    """Flow limit: round-robin across ordering keys."""


def make_spec(
    handler: Handler, *, name: str | None = None, **options: Unpack[SubscriberOptions]
) -> SubscriberSpec:
    """Validate a subscriber declaration."""
    validate.known_options(options, SubscriberOptions.__optional_keys__, "subscriber")
    topics, queue = options.get("topics"), options.get("queue")
    retry, ack = options.get("retry"), options.get("ack", "auto")
    on_dead_letter, prefetch = options.get("on_dead_letter"), options.get("prefetch")
    lease, timeout = options.get("lease"), options.get("timeout", DEFAULT_TIMEOUT)
    if not callable(handler):
        raise InvalidOption("handler", "must be a function or other callable")
    if (topics is None) == (queue is None):
        raise InvalidOption("topics", "give exactly one of topics=[…] or queue=…")
    if queue is not None:
        queue = validate_topic(queue, "queue")
        patterns: tuple[str, ...] = (queue,)
        name = queue if name is None else validate_topic(name, "name")
        if name != queue:
            raise InvalidOption("name", "a queue subscriber is named after its queue")
    else:
        patterns = validate_patterns(topics, "topics")
        if name is None:
            name = getattr(handler, "__name__", None)
            if not isinstance(name, str) or name == "<lambda>":
                raise InvalidOption("name", "name the subscription (name=…) for this handler")
            name = name.replace("_", "-")
        name = validate_topic(name, "name")
    if ack not in ("auto", "manual"):
        raise InvalidOption("ack", "must be 'auto' or 'manual'")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise InvalidOption("retry", "must be a RetryPolicy")
    if on_dead_letter is not None and not callable(on_dead_letter):
        raise InvalidOption("on_dead_letter", "must be callable")
    workers = validate.integer(
        options.get("concurrency", DEFAULT_CONCURRENCY), "concurrency", minimum=1, maximum=10_000
    )
    declared = {
        option: value
        for option, value in options.items()
        if option in FLOW_OPTIONS and value is not None
    }
    return SubscriberSpec(
        name=name,
        handler=handler,
        patterns=patterns,
        is_queue=queue is not None,
        concurrency=workers,
        prefetch=(
            None
            if prefetch is None
            else validate.integer(prefetch, "prefetch", minimum=0, maximum=10_000)
        ),
        lease=None if lease is None else validate.lease_seconds(lease),
        timeout=None if timeout is None else validate.lease_seconds(timeout, "timeout"),
        retry=retry or RetryPolicy(),
        ack=ack,
        on_dead_letter=on_dead_letter,
        flow=flow_limits(declared) if declared else None,
    )
