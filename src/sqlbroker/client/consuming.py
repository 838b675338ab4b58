"""The low-level consumer API of both faces: claim a batch, then complete, retry,
dead-letter, extend or release each delivery by its lease (plans: see
:mod:`sqlbroker.features.faces`)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption, LeaseLost
from sqlbroker.core.message import Delivery, ErrorInfo
from sqlbroker.core.policies import DEFAULT_RETRY
from sqlbroker.core.serde import encode_value
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.core.topics import validate_topic
from sqlbroker.features.faces import Plan, call
from sqlbroker.storage.caller import CallerConnection

if TYPE_CHECKING:
    from sqlbroker.client.base import BrokerBase


def delivery_list(
    value: Delivery | Iterable[Delivery], field: str = "deliveries"
) -> list[Delivery]:
    """A ``Delivery`` or an iterable of them as a list, each copy once (the shape checked
    before anything is written)."""
    if isinstance(value, Delivery):
        return [value]
    items = validate.items(value, field, "Delivery objects (or one Delivery)")
    seen: set[int] = set()
    for item in items:
        if not isinstance(item, Delivery):
            raise InvalidOption(field, f"must hold Delivery objects, not {type(item).__name__}")
        # Two deliveries of one copy (a stale one and its re-claim) cannot be told apart by
        # the write, which matches on the copy: the stale one's refusal would go unreported.
        if item.id in seen:
            raise InvalidOption(
                field, f"holds two deliveries of copy {item.id}: settle each copy once per call"
            )
        seen.add(item.id)
    return items


def _one(value: Delivery | Iterable[Delivery]) -> Delivery:
    """The one delivery that retry, dead_letter and extend act on."""
    items = delivery_list(value, "delivery")
    if len(items) != 1:
        raise InvalidOption("delivery", f"must be one Delivery, not {len(items)}")
    return items[0]


def raise_lost(wanted: Iterable[int], done: Iterable[int]) -> None:
    """``LeaseLost`` naming the copies of ``wanted`` the write did not settle."""
    lost = sorted(set(wanted) - set(done))
    if lost:
        raise LeaseLost(lost)


TAKE_BACK_EVERY = 1.0
"""Seconds between two sweeps of expired leases by :func:`claim`."""
TAKE_BACK_BATCH = 1000


def worker_name() -> str:
    """How this process names itself in leases: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def claim(
    broker: BrokerBase,
    subscription: str,
    *,
    limit: int = 1,
    lease: float | timedelta | None = None,
    worker: str | None = None,
) -> Plan[list[Delivery]]:
    """Lease up to ``limit`` messages, most urgent first. Each delivery carries a lease
    token; complete, retry or dead-letter it before ``lease`` seconds pass, or it is
    delivered again.

    A claim also takes back expired leases (about once a second per broker): the
    messages of a consumer that died come back to the next claim once their lease
    has run out — or are dead-lettered as ``worker lost`` when that was their last
    attempt — without any worker running."""
    validate_topic(subscription, "subscription")
    count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_CLAIM)
    seconds = broker.lease if lease is None else validate.lease_seconds(lease)
    name = (
        worker_name()
        if worker is None
        else validate.text(worker, "worker", maximum=200, printable=True)
    )
    if _take_back_due(broker):
        yield call("lease_release_expired", limit=TAKE_BACK_BATCH)
    claimed: list[Delivery] = yield call(
        "message_claim_many", subscription=subscription, limit=count, lease=seconds, worker=name
    )
    return claimed


def _take_back_due(broker: BrokerBase) -> bool:
    """Whether a claim should first return expired leases to their queues
    (dead-lettering those whose attempts are spent), as a worker's reaper does: at most
    once every ``TAKE_BACK_EVERY`` seconds, so that a consumer loop of one's own sees
    the messages of a consumer that died, with no worker running anywhere (as SQS's
    visibility timeout does)."""
    now = broker._clock.now() if broker._clock is not None else None
    at = now.timestamp() if now is not None else time.monotonic()
    last = broker._taken_back_at
    if last is not None and 0 <= at - last < TAKE_BACK_EVERY:
        return False
    broker._taken_back_at = at
    return True


def complete(
    broker: BrokerBase,
    deliveries: Delivery | Iterable[Delivery],
    *,
    conn: CallerConnection | None = None,
    result: Any = None,
) -> Plan[None]:
    """Acknowledge deliveries: they are archived as completed. Those whose lease was lost
    are left alone and reported by one ``LeaseLost`` after the others are completed.

    With ``conn`` the acknowledgement joins the caller's open transaction (as a publish
    with ``conn`` does), so the caller's writes and the ack commit together; on
    ``LeaseLost`` the caller should roll back, as another consumer has the message.

    ``result`` is stored as the delivery's result (docs/results.md), as a handler's
    return value is: a JSON value under the payload limit (``InvalidPayload`` otherwise,
    nothing written), for one delivery at a time; ``None`` stores nothing."""
    items = delivery_list(deliveries)
    value = None
    if result is not None:
        if len(items) != 1:
            raise InvalidOption("result", f"is for one delivery at a time, not {len(items)}")
        value = encode_value(result, limit=broker.publish_defaults.payload_limit, field="result")
    if not items:
        return
    settlements = [Settlement.complete(d, value) for d in items]
    done = yield call("message_settle_many", conn=conn, settlements=settlements)
    if len(done) != len(items):
        raise_lost([d.id for d in items], done)


def retry(
    broker: BrokerBase,
    delivery: Delivery,
    *,
    after: float | timedelta = 0.0,
    error: BaseException | str | None = None,
) -> Plan[None]:
    """Give a delivery back to be tried again after ``after`` seconds. When its attempts
    are spent (the retry policy's rule, :meth:`~sqlbroker.RetryPolicy.spent`) it is
    dead-lettered instead (reason ``max attempts exhausted``)."""
    item = _one(delivery)
    delay = validate.seconds(after, "after")
    settlement = DEFAULT_RETRY.decide_retry(item, after=delay, error=ErrorInfo.coerce(error))
    raise_lost([item.id], (yield call("message_settle_many", settlements=[settlement])))


def dead_letter(
    broker: BrokerBase,
    delivery: Delivery,
    *,
    reason: str,
    error: BaseException | str | None = None,
) -> Plan[None]:
    """Move a delivery to the dead letters now, keeping the whole message and why."""
    item = _one(delivery)
    settlement = Settlement.dead(item, validate.reason(reason), ErrorInfo.coerce(error))
    raise_lost([item.id], (yield call("message_settle_many", settlements=[settlement])))


def extend(
    broker: BrokerBase, delivery: Delivery, *, lease: float | timedelta | None = None
) -> Plan[datetime]:
    """Push the delivery's lease to now + ``lease``; return the new expiry."""
    item = _one(delivery)
    seconds = broker.lease if lease is None else validate.lease_seconds(lease)
    extended = yield call("message_extend_leases", leases=[Lease.of(item)], lease=seconds)
    raise_lost([item.id], extended)
    expiry: datetime = extended[item.id]
    return expiry


def release(broker: BrokerBase, deliveries: Delivery | Iterable[Delivery]) -> Plan[None]:
    """Give back deliveries that were never started; the attempt is not counted."""
    items = delivery_list(deliveries)
    if items:
        done = yield call("message_release_many", leases=[Lease.of(d) for d in items])
        raise_lost((d.id for d in items), done)


def cancel(
    broker: BrokerBase, message_id: str, *, actor: str | None = None, note: str | None = None
) -> Plan[int]:
    """Cancel every copy of a message: copies not running are archived as cancelled
    now; a running copy's worker is told to stop its handler (within about a second;
    docs/flow-control.md) and archives it as cancelled. Recorded in the audit trail
    when it reached a copy (``actor`` defaults to ``api:<user>``). Return how many
    copies were cancelled or told to stop."""
    canonical = validate.message_id(message_id)
    who = validate.actor(actor)
    why = None if note is None else validate.reason(note, "note")
    cancelled: int = yield call("message_cancel_many", message_ids=[canonical], actor=who, note=why)
    return cancelled
