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
    def checked(cls, **limits: object) -> Limits:
        """The limits given by name (``max_copies=…``), each checked."""
        return cls(
            **{
                name: validate.integer(value, name, minimum=1, maximum=_CEILING)
                for name, value in limits.items()
            }
        )

    def check_room(
        self, *, subscription: str, own_patterns: int, subscriptions: int, patterns: int
    ) -> None:
        """After a subscription was created or given patterns (inside that transaction,
        which the error rolls back): its pattern count and the database's totals."""
        checks = (
            ("patterns", own_patterns, PATTERNS_PER_SUBSCRIPTION),
            ("max_subscriptions", subscriptions, self.max_subscriptions),
            ("max_patterns", patterns, self.max_patterns),
        )
        for field, wanted, limit in checks:
            if wanted > limit:
                problems = {
                    "patterns": f"subscription {subscription!r} would have {wanted} patterns;"
                    f" a subscription has at most {limit}",
                    "max_subscriptions": f"creating {subscription!r} would make {wanted}"
                    f" subscriptions (queues included); the limit is {limit} per database:"
                    " delete unused ones, or raise it with Broker(max_subscriptions=...)",
                    "max_patterns": f"this would make {wanted} subscription patterns in the"
                    f" database; the limit is {limit} (every publish reads them): delete"
                    " unused ones, or raise it with Broker(max_patterns=...)",
                }
                raise LimitExceeded(field, problems[field], limit=limit, wanted=wanted)


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
