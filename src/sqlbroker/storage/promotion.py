"""When a claim should first promote its subscription's due delayed copies.

Delayed copies wait in state ``scheduled`` so that the claim index holds only copies that
are ready; a statement moves the due ones to ``available``. Running it before every claim
cost a second statement per round trip (about a tenth of a claim's client time); it now
runs before a claim only when the subscription was last promoted at least ``interval`` ago,
by this backend object. A delayed message therefore becomes claimable at most ``interval``
after its time — far below a worker's poll interval, which bounds its pickup anyway.

Time is the injected clock's when there is one (a test's manual clock moving forward
promotes at once), else the process's monotonic clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_INTERVAL = 0.05


class PromotionThrottle:
    def __init__(
        self, interval: float = DEFAULT_INTERVAL, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._monotonic = monotonic
        self._last: dict[str, tuple[bool, float]] = {}

    def due(self, subscription: str, injected_now: float | None) -> bool:
        """Whether to promote before this claim; records the promotion when it is."""
        injected = injected_now is not None
        moment = injected_now if injected_now is not None else self._monotonic()
        last = self._last.get(subscription)
        if last is not None and last[0] == injected and 0 <= moment - last[1] < self._interval:
            return False
        self._last[subscription] = (injected, moment)
        return True
