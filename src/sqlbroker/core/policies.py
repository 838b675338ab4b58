"""Retry and dead-letter decisions, and the exceptions a handler raises to steer them.

A :class:`RetryPolicy` is a small object with one decision method: given the delivery whose
attempt just failed and its error, :meth:`RetryPolicy.decide` returns its
:class:`~sqlbroker.core.settlements.Settlement`: a retry after how long, or a dead letter
and why. Backoff is exponential with full jitter (a uniformly random delay between zero
and the capped exponential), which spreads retries of a failed dependency.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.message import Delivery, ErrorInfo
from sqlbroker.core.settlements import Settlement


class Reject(Exception):
    """Raise in a handler to dead-letter the message now, without further attempts."""

    def __init__(self, reason: str = "rejected by the handler") -> None:
        self.reason = reason
        super().__init__(reason)


class Retry(Exception):
    """Raise in a handler to try the message again after ``after`` seconds (a snooze).

    A snooze does not use up an attempt.
    """

    def __init__(
        self, after: float | timedelta = 0.0, reason: str = "snoozed by the handler"
    ) -> None:
        self.after = validate.seconds(after, "after")
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class RetryPolicy:
    """How failures are retried.

    - ``max_attempts``: attempts before dead-lettering; ``None`` uses the message's own
      ``max_attempts`` (set at publish, default 5).
    - ``base`` / ``cap``: the n-th retry waits up to ``min(cap, base * 2**(n-1))`` seconds.
    - ``jitter``: ``"full"`` (uniform in [0, backoff], the default) or ``"none"``.
    - ``retry_on``: exception types that are retried (default: every ``Exception``).
    - ``dead_on``: exception types that go to the dead letters at once (checked first).
    """

    max_attempts: int | None = None
    base: float = 1.0
    cap: float = 300.0
    jitter: str = "full"
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dead_on: tuple[type[BaseException], ...] = ()
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts is not None:
            validate.integer(
                self.max_attempts, "max_attempts", minimum=1, maximum=validate.MAX_ATTEMPTS
            )
        validate.seconds(self.base, "base")
        validate.seconds(self.cap, "cap")
        if self.jitter not in ("full", "none"):
            raise InvalidOption("jitter", "must be 'full' or 'none'")
        for name in ("retry_on", "dead_on"):
            kinds = getattr(self, name)
            if not isinstance(kinds, tuple) or not all(
                isinstance(kind, type) and issubclass(kind, BaseException) for kind in kinds
            ):
                raise InvalidOption(name, "must be a tuple of exception types")

    def backoff(self, attempt: int) -> float:
        """The delay before the retry that follows failed attempt ``attempt`` (1-based)."""
        ceiling = min(self.cap, self.base * 2 ** min(max(attempt - 1, 0), 60))
        return ceiling if self.jitter == "none" else self.rng.uniform(0, ceiling)

    def decide(self, delivery: Delivery, error: BaseException) -> Settlement:
        """How ``delivery``'s attempt that failed with ``error`` ends: a retry after the
        backoff (a snooze for ``Retry``), or a dead letter with its reason. The delivery's
        own ``max_attempts`` applies unless this policy sets its own."""
        info = ErrorInfo.from_exception(error)
        if isinstance(error, Reject):
            return Settlement.dead(delivery, error.reason, info)
        if isinstance(error, Retry):
            return Settlement.retry(delivery, error.after, info, snooze=True)
        kind = type(error).__name__
        if self.dead_on and isinstance(error, self.dead_on):
            return Settlement.dead(delivery, f"non-retryable error: {kind}", info)
        if not isinstance(error, self.retry_on):
            return Settlement.dead(delivery, f"error not in retry_on: {kind}", info)
        spent = self.spent(delivery.attempt, max_attempts=delivery.max_attempts)
        if spent is not None:
            return Settlement.dead(delivery, f"{spent}: {kind}", info)
        return Settlement.retry(delivery, self.backoff(delivery.attempt), info)

    def decide_retry(
        self, delivery: Delivery, *, after: float, error: ErrorInfo | None = None
    ) -> Settlement:
        """A retry asked for by name (``Broker.retry``, ``msg.nack``): after ``after``
        seconds, or a dead letter when ``delivery``'s attempts are spent."""
        spent = self.spent(delivery.attempt, max_attempts=delivery.max_attempts)
        if spent is None:
            return Settlement.retry(delivery, after, error)
        return Settlement.dead(delivery, spent, error)

    def spent(self, attempt: int, *, max_attempts: int) -> str | None:
        """Why failed attempt ``attempt`` was the last one (``None``: it was not). The one
        rule for "attempts spent"; a worker's claims store this policy's limit in each
        copy's ``max_attempts``, which the reaper applies to a lost worker's copies."""
        limit = self.max_attempts or max_attempts
        return f"max attempts exhausted ({attempt} of {limit})" if attempt >= limit else None


DEFAULT_RETRY = RetryPolicy()
"""The policy of a retry outside a worker (``Broker.retry``): the copy's own limit, which a
worker's claim set from its subscriber's policy."""
