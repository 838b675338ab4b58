"""Subscriber declarations: what a worker consumes and how, validated up front.

``@broker.subscriber(...)`` builds a :class:`SubscriberSpec`; the runtime turns each spec
into a pump. Nothing here runs handlers or touches the database.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.flow import FlowLimits, Rate, flow_limits
from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.topics import validate_pattern, validate_topic

AckMode = Literal["auto", "manual"]
Handler = Callable[[Any], Any]
DeadLetterHook = Callable[[Any, str], Any]

DEFAULT_CONCURRENCY = 10
DEFAULT_TIMEOUT = 300.0


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
    """Extra claims ahead of free slots; ``None`` lets the pump size it (see runtime.pump)."""
    lease: float | None
    timeout: float | None
    retry: RetryPolicy
    ack: AckMode
    on_dead_letter: DeadLetterHook | None
    flow: FlowLimits | None = None
    """The subscription's flow limits, set when the worker starts (``None``: the worker
    leaves those the subscription has, e.g. set with ``sqlbroker flow``)."""

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.handler) or inspect.iscoroutinefunction(
            getattr(self.handler, "__call__", None)  # noqa: B004 - async callable objects
        )


def make_spec(
    handler: Handler,
    *,
    name: str | None = None,
    topics: Sequence[str] | str | None = None,
    queue: str | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    prefetch: int | None = None,
    lease: float | timedelta | None = None,
    timeout: float | timedelta | None = DEFAULT_TIMEOUT,
    retry: RetryPolicy | None = None,
    ack: AckMode = "auto",
    on_dead_letter: DeadLetterHook | None = None,
    max_running: int | None = None,
    key_concurrency: int | None = None,
    rate_limit: str | Rate | None = None,
    key_rate_limit: str | Rate | None = None,
    fair: bool | None = None,
) -> SubscriberSpec:
    """Validate a subscriber declaration."""
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
        topic_list = (
            [topics] if isinstance(topics, str) else validate.items(topics, "topics", "patterns")
        )
        if not topic_list:
            raise InvalidOption("topics", "give at least one topic pattern")
        patterns = tuple(validate_pattern(p, "topics") for p in topic_list)
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
    workers = validate.integer(concurrency, "concurrency", minimum=1, maximum=10_000)
    declared = {
        option: value
        for option, value in (
            ("max_running", max_running),
            ("key_concurrency", key_concurrency),
            ("rate_limit", rate_limit),
            ("key_rate_limit", key_rate_limit),
            ("fair", fair),
        )
        if value is not None
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
        timeout=None
        if timeout is None
        else validate.seconds(timeout, "timeout", maximum=validate.MAX_LEASE, allow_zero=False),
        retry=retry or RetryPolicy(),
        ack=ack,
        on_dead_letter=on_dead_letter,
        flow=flow_limits(declared) if declared else None,
    )
