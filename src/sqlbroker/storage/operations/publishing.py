"""Publishing: idempotency keys, ordering keys, routing and the insert of every copy.

One plan for both dialects. A dialect that binds whole arrays (PostgreSQL) sends a batch
as one statement over arrays; the other (SQLite, in-process: a statement costs no round
trip) runs the ``_one`` form of the same block once per row, with scalar parameters, and
the rows of the runs are concatenated. PostgreSQL takes the ``_one`` form for one row too:
scalar parameters get a cached generic plan, an array's unnest is planned on every send.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlbroker.core.errors import IdempotencyConflict
from sqlbroker.core.limits import check_copies
from sqlbroker.core.message import NewMessage, message_column
from sqlbroker.core.topics import pattern_regex
from sqlbroker.storage.base import InsertResult
from sqlbroker.storage.operations.subscriptions import queue_create
from sqlbroker.storage.plan import Plan, Query, Rows, atomic_when, each, query

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings

_SHARED_COLUMNS = frozenset(
    {"topic", "priority", "ordering_key", "idempotency_key", "content_type", "headers"}
    | {"max_attempts", "at", "delay", "expires", "ttl"}
)
"""The columns of a batch that are often the same for every message (see message_batch in
the PostgreSQL SQL)."""

UNLIMITED = 2**62
"""``max_copies`` when the caller sets none (the broker's own bulk paths)."""


def _floats(values: list[float | None]) -> list[float | None]:
    # PostgreSQL binds arrays in binary (``%(name)b``), and a binary array must not mix
    # int and float.
    if values.count(None) == len(values):
        return values
    return [None if value is None else float(value) for value in values]


def _any_set(values: list[Any]) -> bool:
    """Whether any of ``values`` is not ``None``."""
    return values.count(None) != len(values)


def _rows(
    settings: Settings,
    block: str,
    columns: Mapping[str, list[Any]],
    *,
    read: bool = True,
    squeeze: frozenset[str] = frozenset(),
    uniform: str | None = None,
    **shared: Any,
) -> Plan[Rows]:
    """``block`` over the arrays ``columns`` in one statement, or ``block_one`` once per
    row (see the module's docstring), its rows concatenated; ``shared`` goes to each.
    Unless they are ``read``, the runs of one row are one ``executemany``. A column named
    in ``squeeze`` whose values are all equal goes to the array statement as one value
    (the block reads it as standing for every row); when every one of them is, the
    ``uniform`` block (if given) runs instead, with those columns as scalars."""
    count = len(next(iter(columns.values())))
    if settings.array_params and count > 1:
        same = {name for name in squeeze if columns[name].count(columns[name][0]) == count}
        if uniform is not None and same == squeeze:
            scalars = {
                name: values[0] if name in squeeze else values for name, values in columns.items()
            }
            return (yield query(uniform, **scalars, **shared))
        arrays = {name: values[:1] if name in same else values for name, values in columns.items()}
        return (yield query(block, **arrays, **shared))
    rows = [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]
    if not read and count > 1:
        return (yield each(f"{block}_one", rows, **shared))
    found = Rows([], 0)
    for row in rows:
        found.extend((yield query(f"{block}_one", **row, **shared)))
    return found


def _needs_transaction(
    settings: Settings,
    *,
    messages: Sequence[NewMessage],
    subscription: str | None,
    max_copies: int | None = None,
) -> bool:
    """Whether a publish takes more than one statement: keys to reserve or lock, or a
    queue this process has not seen exist (a single statement is its own transaction)."""
    known = settings.known_queues
    return (
        (subscription is not None and (known is None or subscription not in known))
        or _any_set(message_column(messages, "idempotency_key"))
        or _any_set(message_column(messages, "ordering_key"))
    )


@atomic_when(_needs_transaction)
def message_insert_many(
    settings: Settings,
    *,
    messages: Sequence[NewMessage],
    subscription: str | None,
    max_copies: int | None = None,
) -> Plan[InsertResult]:
    """Insert messages, all or nothing.

    With ``subscription`` the copies go to that subscription only (point-to-point), which
    is created first when it does not exist yet; without it each message fans out to every
    subscription with a matching pattern, and one that matches none is archived as
    ``unrouted``. Idempotency keys are reserved per topic for each message's
    ``dedupe_window`` seconds: a duplicate returns the original's id and writes nothing, a
    conflicting one raises ``IdempotencyConflict`` and writes nothing. More than
    ``max_copies`` copies in all raise ``LimitExceeded`` and write nothing. A copy whose
    ordering key already has a copy in its subscription starts ``blocked`` behind it. A
    message marked ``replace`` (or ``debounce``) then takes the place of its key's pending
    copy of the same topic where there is one (:func:`_replace_pending`)."""
    keys = message_column(messages, "ordering_key")
    ordering_keys = sorted(set(keys) - {None}) if _any_set(keys) else []
    if ordering_keys and settings.key_locks:
        yield query("key_lock", keys=ordering_keys)
    originals: dict[str, str] = {}
    if _any_set(message_column(messages, "idempotency_key")):
        keyed = [m for m in messages if m.idempotency_key is not None]
        originals = yield from _dedupe(settings, keyed)
    fresh = [m for m in messages if m.message_id not in originals] if originals else messages
    unrouted = replaced = 0
    if fresh:
        known = settings.known_queues
        existed = False  # found committed before this statement: see KnownQueues
        unsure = False  # SQLite: a known queue, not created here, that the insert checks
        if subscription is not None:
            check_copies(len(fresh), len(messages), max_copies)
            if known is None or subscription not in known:
                existed = not (yield from queue_create(settings, name=subscription))
            elif not settings.inserts_create_queue:
                # SQLite's inserts do not create their queue: a single unkeyed send checks
                # that the known queue is still there, any other insert creates it first.
                unsure = len(fresh) == 1 and not ordering_keys
                if not unsure:
                    yield from queue_create(settings, name=subscription)
        # A queue publish needs no routing; one keyed message, no window over keys either.
        block = "message_insert"
        if subscription is not None and not ordering_keys:
            block = "message_insert_queue"
        elif subscription is not None and len(fresh) == 1:
            block = "message_insert_keyed"  # its _one form: see _rows
        routed = block != "message_insert_queue"
        if (
            routed
            and subscription is None
            and max_copies is not None
            and not settings.array_params
            and len(fresh) > 1
        ):
            # Run row by row, the statements cannot see the batch: count its copies first,
            # so that a refused fan-out writes nothing at all. (One message's statement
            # counts its own routes and writes nothing past the limit.)
            topics = Counter(message_column(fresh, "topic"))
            ((copies,),) = yield query(
                "message_copies",
                topics=list(topics),
                counts=list(topics.values()),
                subscription=None,
            )
            check_copies(copies, len(messages), max_copies)
        shared = {
            "subscription": subscription,
            "queue_regex": None if subscription is None else pattern_regex(subscription),
            "channel": settings.notify_channel,
            "max_copies": UNLIMITED if max_copies is None else max_copies,
        }
        if unsure and subscription is not None and known is not None:
            params = _row(fresh[0], shared)
            rows = yield Query("message_insert_queue_known_one", params)
            if not rows.rowcount:
                # Deleted since (by another process): created as on its first use.
                known.discard(subscription)
                yield from queue_create(settings, name=subscription)
                rows = yield Query(_ONE[block], params)
        elif len(fresh) == 1:  # what _rows runs for one row, without the columns
            rows = yield Query(_ONE[block], _row(fresh[0], shared))
        else:
            rows = yield from _rows(
                settings,
                block,
                _columns(fresh),
                read=routed,
                squeeze=_SHARED_COLUMNS,
                uniform="message_insert_shared" if routed else "message_insert_queue_shared",
                **shared,
            )
        if routed:
            unrouted = sum(int(row[0]) for row in rows)
            # Past the limit a statement writes nothing; raising rolls back the others.
            check_copies(sum(int(row[2]) for row in rows), len(messages), max_copies)
        if existed and subscription is not None and known is not None:
            known.add(subscription)
        if any(message_column(fresh, "replace")):
            took: Counter[str] = Counter()
            for message in fresh:
                if message.replace:
                    took.update((yield from _replace_pending(settings, message)))
            if took:
                # Counted in the lifetime totals (stats().replaced), in one statement in one
                # order of rows, as a worker's heartbeat adds its own.
                names = sorted(took)
                yield query(
                    "metric_total_add_many",
                    subscriptions=names,
                    outcomes=["replaced"] * len(names),
                    deltas=[took[name] for name in names],
                )
                replaced = sum(took.values())
    ids = message_column(messages, "message_id")
    return InsertResult(
        message_ids=[originals.get(i, i) for i in ids] if originals else ids,
        duplicates=len(originals),
        unrouted=unrouted,
        replaced=replaced,
    )


def _replace_pending(settings: Settings, message: NewMessage) -> Plan[list[str]]:
    """Fold the copies just inserted for ``message`` (``replace``/``debounce``) into their
    key's pending copies; return the subscription of each copy replaced.

    Each new copy went in like any keyed copy, last of its key in its subscription (blocked
    behind any earlier one). Where the copy just before it is of the same topic and still
    pending (never claimed, not a replayed dead letter), that copy leaves and the new one
    takes its place: its state, first enqueue time and available time (debounced: the new
    one's, bounded by the first enqueue + ``debounce_max``). Elsewhere the new copy stays.
    The key is locked (PostgreSQL) or the database is (SQLite), so no other publisher of
    the key runs in between; a worker that claims the pending copy first wins: a running
    copy is never replaced, and the new copy stays queued behind it."""
    rows = yield query(
        "message_replace",
        message_id=message.message_id,
        debounce=message.debounce,
        debounce_max=message.debounce_max,
        channel=settings.notify_channel,
    )
    return [row[0] for row in rows]


_FIELDS = {
    "message_id": "message_id",
    "topic": "topic",
    "priority": "priority",
    "ordering_key": "ordering_key",
    "idempotency_key": "idempotency_key",
    "payload": "payload",
    "content_type": "content_type",
    "headers": "headers",
    "max_attempts": "max_attempts",
    "at": "available_at",
    "delay": "delay",
    "expires": "expires_at",
    "ttl": "ttl",
}
"""The insert's parameters and the message field each takes its values from."""


_ONE = {
    block: f"{block}_one"
    for block in ("message_insert", "message_insert_queue", "message_insert_keyed")
}


def _row(message: NewMessage, shared: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``message`` for the ``_one`` form of an insert (its row of
    :func:`_columns`), with ``shared``."""
    # _FIELDS spelled out: a dict display costs a quarter of one built from _FIELDS, on
    # every single publish (tests/storage/test_insert_row.py holds the two together).
    delay, ttl = message.delay, message.ttl
    return {
        "message_id": message.message_id,
        "topic": message.topic,
        "priority": message.priority,
        "ordering_key": message.ordering_key,
        "idempotency_key": message.idempotency_key,
        "payload": message.payload,
        "content_type": message.content_type,
        "headers": message.headers,
        "max_attempts": message.max_attempts,
        "at": message.available_at,
        "delay": None if delay is None else float(delay),
        "expires": message.expires_at,
        "ttl": None if ttl is None else float(ttl),
        **shared,
    }


def _columns(messages: Sequence[NewMessage]) -> dict[str, list[Any]]:
    columns = {param: message_column(messages, field) for param, field in _FIELDS.items()}
    for param in ("delay", "ttl"):
        columns[param] = _floats(columns[param])
    return columns


def _dedupe(settings: Settings, keyed: Sequence[NewMessage]) -> Plan[dict[str, str]]:
    """Reserve idempotency keys; map each duplicate's message id to the original's id.

    Raises ``IdempotencyConflict`` (rolling the transaction back) when a live key was used
    for a different payload. Repeats inside the batch are settled here first, because one
    INSERT … ON CONFLICT cannot touch the same row twice."""
    originals: dict[str, str] = {}
    first: dict[tuple[str, str], NewMessage] = {}
    for message in keyed:
        assert message.idempotency_key is not None
        slot = (message.topic, message.idempotency_key)
        if slot not in first:
            first[slot] = message
            continue
        if first[slot].payload_hash != message.payload_hash:
            raise IdempotencyConflict(
                message.topic, message.idempotency_key, first[slot].message_id
            )
        originals[message.message_id] = first[slot].message_id
    unique = list(first.values())
    reserved = yield from _rows(
        settings,
        "dedupe_reserve",
        {
            "topic": [m.topic for m in unique],
            "idempotency_key": [m.idempotency_key for m in unique],
            "message_id": [m.message_id for m in unique],
            "payload_hash": [m.payload_hash for m in unique],
            "window": [float(m.dedupe_window) for m in unique],
        },
    )
    won = {(topic, key) for topic, key in reserved}
    taken = [m for m in unique if (m.topic, m.idempotency_key) not in won]
    if taken:
        rows = yield from _rows(
            settings,
            "dedupe_get",
            {
                "topic": [m.topic for m in taken],
                "idempotency_key": [m.idempotency_key for m in taken],
            },
        )
        existing = {
            (topic, key): (str(message_id), digest) for topic, key, message_id, digest in rows
        }
        for message in taken:
            assert message.idempotency_key is not None
            message_id, digest = existing[(message.topic, message.idempotency_key)]
            if digest != message.payload_hash:
                raise IdempotencyConflict(message.topic, message.idempotency_key, message_id)
            originals[message.message_id] = message_id
    for message in keyed:
        assert message.idempotency_key is not None
        original = originals.get(first[(message.topic, message.idempotency_key)].message_id)
        if original is not None:
            originals[message.message_id] = original
    return originals
