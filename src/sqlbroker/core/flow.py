"""Flow limits of a subscription: concurrency caps, rate limits and fairness.

They are settings of the subscription in the database, so that every worker on every host
obeys the same ones (docs/flow-control.md). This module holds their values and the rules
for reading them from what a user writes (``rate_limit="100/min"``); the claim statement
enforces them.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.message import Delivery

MAX_CAP = 1_000_000
"""The largest ``max_running`` or ``key_concurrency``."""


class Keep(enum.Enum):
    """The default of ``set_flow``'s limits: the limit not named stays as it is (``None``
    removes it)."""

    KEEP = "keep"


KEEP = Keep.KEEP
MAX_RATE_COUNT = 1_000_000_000
MIN_RATE_PERIOD = 0.001
MAX_RATE_PERIOD = 366 * 86400.0

_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*")


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` claims per ``period`` seconds, spread evenly: one every
    ``period / count`` seconds, with at most one second's worth (at least one) at once
    after a quiet spell (the claim statement's rule, flow.sql)."""

    count: int
    period: float

    def __str__(self) -> str:
        for unit in ("day", "hour", "min", "s"):
            if self.period == _UNITS[unit]:
                return f"{self.count}/{unit}"
        return f"{self.count}/{self.period:g}s"


def rate(value: object, field: str) -> Rate | None:
    """A rate limit: ``None``, a :class:`Rate`, or text ``"N/unit"`` or ``"N/Xunit"``
    (``100/min``, ``5/s``, ``10/30s``, ``1000/hour``; units ms, s, min, h, day)."""
    if value is None:
        return None
    if isinstance(value, Rate):
        count, period = value.count, value.period
    elif isinstance(value, str):
        match = _RATE.fullmatch(value.lower())
        unit = "" if match is None else match.group(3)
        if unit not in _UNITS and unit.endswith("s"):
            unit = unit[:-1]
        if match is None or unit not in _UNITS:
            raise InvalidOption(
                field,
                f"must look like '100/min' or '5/s' (units: ms, s, min, h, day), not {value!r}",
            )
        count = int(match.group(1))
        period = float(match.group(2) or 1) * _UNITS[unit]
    else:
        raise InvalidOption(field, f"must be text such as '100/min', not {type(value).__name__}")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RATE_COUNT:
        raise InvalidOption(field, f"the count must be from 1 to {MAX_RATE_COUNT}, not {count!r}")
    if (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        or not math.isfinite(period)
        or not MIN_RATE_PERIOD <= period <= MAX_RATE_PERIOD
    ):
        raise InvalidOption(
            field, f"the period must be from 1 ms to 366 days, not {period!r} seconds"
        )
    return Rate(count, float(period))


def cap(value: object, field: str) -> int | None:
    """A concurrency cap: ``None`` (no cap) or an integer from 1."""
    if value is None:
        return None
    return validate.integer(value, field, minimum=1, maximum=MAX_CAP)


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """What a subscription's claims obey; ``None`` (``False``) is no limit.

    - ``max_running``: copies running at once, across all workers and hosts;
    - ``key_concurrency``: copies of one ordering key running at once (without it a key
      runs one at a time, in order; with it, up to that many, so no longer in order);
    - ``rate_limit`` / ``key_rate_limit``: claims per period, of the subscription / of
      each ordering key;
    - ``fair``: claims take the ordering keys in turn (copies without a key are one more
      key), so a burst of one key does not delay the others."""

    max_running: int | None = None
    key_concurrency: int | None = None
    rate_limit: Rate | None = None
    key_rate_limit: Rate | None = None
    fair: bool = False

    @property
    def limited(self) -> bool:
        return self != FlowLimits()


FLOW_OPTIONS = ("max_running", "key_concurrency", "rate_limit", "key_rate_limit", "fair")


def flow_limits(options: Mapping[str, object], *, base: FlowLimits | None = None) -> FlowLimits:
    """Validated limits from ``options`` (names of :class:`FlowLimits`; an unknown name is a
    ``ValidationError``), over ``base`` (the options not given keep its values)."""
    unknown = sorted(set(options) - set(FLOW_OPTIONS))
    if unknown:
        raise InvalidOption(unknown[0], f"is not a flow limit (known: {', '.join(FLOW_OPTIONS)})")
    start = base or FlowLimits()

    def given(name: str) -> object:
        return options[name] if name in options else getattr(start, name)

    return FlowLimits(
        max_running=cap(given("max_running"), "max_running"),
        key_concurrency=cap(given("key_concurrency"), "key_concurrency"),
        rate_limit=rate(given("rate_limit"), "rate_limit"),
        key_rate_limit=rate(given("key_rate_limit"), "key_rate_limit"),
        fair=validate.flag(given("fair"), "fair"),
    )


@dataclass(frozen=True, slots=True)
class Flow:
    """A subscription's flow limits and where it stands against them now
    (:meth:`Broker.flow`)."""

    subscription: str
    limits: FlowLimits
    running: int
    """Copies running (claimed and not settled), by every worker."""
    throttled_for: float
    """Seconds until the subscription's rate limit lets the next claim through (0: now)."""

    @property
    def at_cap(self) -> bool:
        """Whether ``max_running`` copies are running: claims wait for one to finish."""
        cap = self.limits.max_running
        return cap is not None and self.running >= cap

    @property
    def throttled(self) -> bool:
        """Whether claims wait now, for the rate limit or the concurrency cap."""
        return self.throttled_for > 0 or self.at_cap


class Claimed(list[Delivery]):
    """What a claim returned, and ``wait``: seconds until a rate limit lets the next claim
    of the subscription through, when it is what held this one back (else ``None``)."""

    __slots__ = ("wait",)

    def __init__(self, deliveries: list[Delivery], wait: float | None = None) -> None:
        super().__init__(deliveries)
        self.wait = wait
