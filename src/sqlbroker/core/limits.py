"""The broker's size limits, checked identically on both backends before anything is
committed: how many copies one publish call may write, and how many subscriptions and
patterns a database may hold. Each is a :class:`~sqlbroker.Broker` option; passing it
raises :class:`~sqlbroker.core.errors.LimitExceeded` naming it (docs/guarantees.md,
"Limits")."""

from __future__ import annotations

from dataclasses import dataclass

from sqlbroker.core import validate
from sqlbroker.core.errors import LimitExceeded

DEFAULT_MAX_COPIES = 10_000
DEFAULT_MAX_SUBSCRIPTIONS = 10_000
DEFAULT_MAX_PATTERNS = 10_000
PATTERNS_PER_SUBSCRIPTION = 100
"""Patterns one subscription may have (fixed: routing reads every pattern)."""
_CEILING = 10**9


@dataclass(frozen=True, slots=True)
class Limits:
    """``max_copies``: copies (messages x the subscriptions each fans out to) one
    ``publish``/``publish_many``/``send``/``send_many`` call may write, in one transaction;
    ``max_subscriptions`` and ``max_patterns``: per database (per tenant under row-level
    security)."""

    max_copies: int = DEFAULT_MAX_COPIES
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_patterns: int = DEFAULT_MAX_PATTERNS

    @classmethod
    def checked(
        cls, *, max_copies: object, max_subscriptions: object, max_patterns: object
    ) -> Limits:
        return cls(
            max_copies=validate.integer(max_copies, "max_copies", minimum=1, maximum=_CEILING),
            max_subscriptions=validate.integer(
                max_subscriptions, "max_subscriptions", minimum=1, maximum=_CEILING
            ),
            max_patterns=validate.integer(
                max_patterns, "max_patterns", minimum=1, maximum=_CEILING
            ),
        )

    def check_room(
        self, *, subscription: str, own_patterns: int, subscriptions: int, patterns: int
    ) -> None:
        """After a subscription was created or given patterns (inside that transaction,
        which the error rolls back): its pattern count and the database's totals."""
        if own_patterns > PATTERNS_PER_SUBSCRIPTION:
            raise LimitExceeded(
                "patterns",
                f"subscription {subscription!r} would have {own_patterns} patterns; a"
                f" subscription has at most {PATTERNS_PER_SUBSCRIPTION}",
                limit=PATTERNS_PER_SUBSCRIPTION,
                wanted=own_patterns,
            )
        if subscriptions > self.max_subscriptions:
            raise LimitExceeded(
                "max_subscriptions",
                f"creating {subscription!r} would make {subscriptions} subscriptions (queues"
                f" included); the limit is {self.max_subscriptions} per database: delete"
                " unused ones, or raise it with Broker(max_subscriptions=...)",
                limit=self.max_subscriptions,
                wanted=subscriptions,
            )
        if patterns > self.max_patterns:
            raise LimitExceeded(
                "max_patterns",
                f"this would make {patterns} subscription patterns in the database; the"
                f" limit is {self.max_patterns} (every publish reads them): delete unused"
                " ones, or raise it with Broker(max_patterns=...)",
                limit=self.max_patterns,
                wanted=patterns,
            )


def check_copies(copies: int, messages: int, limit: int | None) -> None:
    """``copies``: what a publish call would write, or as many as were counted when counting
    stopped past ``limit`` (``LimitExceeded.wanted`` is then a lower bound). ``None``: no
    limit (the broker's own bulk paths: schedule ticks, Spark commits)."""
    if limit is not None and copies > limit:
        raise LimitExceeded(
            "max_copies",
            f"this publish of {messages} message(s) would write more than {limit} copies"
            " (messages times the subscriptions each goes to), the limit per call: publish"
            " in smaller batches, or raise it with Broker(max_copies=...)",
            limit=limit,
            wanted=copies,
        )
