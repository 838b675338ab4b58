"""One subscription's pump: fetch, execute, keep leases — write-back is shared.

Its parts are modules of their own: :mod:`~sqlbroker.runtime.fetching` (the claims, and
the stop's end of the waits), :mod:`~sqlbroker.runtime.executing` (the handler slots, and
cancels) and :mod:`~sqlbroker.runtime.holding` (the state they share: held leases, kept,
released, and forgotten once written back).

Invariants:
- a claim never asks for more than the free capacity (``concurrency + prefetch`` minus the
  deliveries claimed and not yet settled), so nothing is claimed that cannot start soon;
  without an explicit ``prefetch`` it is sized so that a claimed message waits about
  ``PREFETCH_WAIT`` in the buffer at the handlers' recent pace (at least the concurrency,
  at most ``MAX_AUTO_PREFETCH``): fast handlers fetch a useful batch per round trip;
- every delivery we hold a lease on is in ``_held`` until its outcome is written back, and
  the lease keeper extends all of them, so a long handler or a slow flush never loses one;
  bookkeeping goes by lease, not by copy: a copy retried at once may be claimed again while
  its first outcome is still being written, and that report must not touch the new claim;
- every delivery a handler started gets exactly one outcome: also when the handler raises a
  ``BaseException``, or is given up inside its transaction (a timeout, a stop at once);
- a delivery whose lease was lost before a handler took it is dropped, not started;
- claimed-but-unstarted deliveries are released on shutdown without counting the attempt,
  and so are the started ones a stop gives up (grace period exceeded): a stop is no failure;
- a delivery whose message was cancelled while held (``Broker.cancel`` flags it, and
  :meth:`Pump.watch_cancels` finds the flag) ends cancelled whatever its handler does:
  a coroutine handler is cancelled, a plain function sees ``msg.cancelled``, an unstarted
  one is not started.
"""

from __future__ import annotations

from sqlbroker.runtime.executing import Executing
from sqlbroker.runtime.fetching import Fetching


class Pump(Fetching, Executing):
    """The pump of one subscription: its claims, its handler slots and their leases."""
