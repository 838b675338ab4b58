"""Publishing and subscriptions, written once for both faces (plans: see
:mod:`sqlbroker.features.faces`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.limits import PATTERNS_PER_SUBSCRIPTION
from sqlbroker.core.message import NewMessage, Subscription
from sqlbroker.core.topics import validate_patterns, validate_topic
from sqlbroker.features.faces import Plan, call
from sqlbroker.features.processed import processed_key
from sqlbroker.features.publishing import (
    PUBLISH_OPTIONS,
    PublishOptions,
    build_batch,
    build_message,
    with_headers,
)
from sqlbroker.storage.caller import CallerConnection

if TYPE_CHECKING:
    from sqlbroker.client.base import BrokerBase


def publish(
    broker: BrokerBase,
    topic: str,
    payload: Any,
    *,
    conn: CallerConnection | None = None,
    **options: Unpack[PublishOptions],
) -> Plan[str]:
    """Publish to every subscription whose pattern matches ``topic``; return the message id.
    The options, each optional, and their defaults: :class:`PublishOptions`.

    Returns after the message is committed (or, with ``conn``, written in the caller's
    open transaction, which the caller commits). A topic no subscription matches is
    archived as ``unrouted``. A repeated ``idempotency_key`` within its window returns
    the first message's id and writes nothing.

    ``delay``/``ttl`` count from the database's now, ``at``/``expires_at`` are
    absolute. A message that would expire before it becomes available is refused
    (``delay`` ≥ ``ttl``, ``at`` ≥ ``expires_at``); a mix of the two kinds (``at`` with
    ``ttl``, ``delay`` with ``expires_at``) cannot be compared before the database's
    clock is read, and such a message expires undelivered if its expiry comes first.

    ``replace=True`` (with ``key``): in each subscription where the key's last copy is
    of this topic and still pending (never claimed), this message takes that copy's
    place instead of queueing behind it: the pending copy leaves, and this one inherits
    its position in the key's order, first enqueue time and available time. A copy
    already claimed is not touched: a new one queues behind it. ``debounce`` (seconds,
    with ``key``; implies ``replace``): the pending copy is replaced and waits until
    ``debounce`` after the last publish, but no longer than ``debounce_max`` after it
    was first enqueued; with none pending the message waits ``debounce`` like a delay.
    A burst of publishes of one key is delivered once, with the last payload
    (docs/flow-control.md, "Debounce and replace"). The id a replaced publish returned
    no longer names a pending message.

    ``conn`` joins the caller's transaction: a psycopg 3 connection (sync or async),
    sqlite3, SQLAlchemy (sync or asyncio) or Django; a sync one is used on the calling
    thread by either face.
    """
    message = build_message(topic, payload, defaults=broker.publish_defaults, **_known(options))
    ids = yield from _insert(broker, [message], None, conn)
    return ids[0]


def publish_many(
    broker: BrokerBase,
    messages: Iterable[Mapping[str, Any]],
    *,
    conn: CallerConnection | None = None,
) -> Plan[list[str]]:
    """Publish a batch in one transaction. Each item is a mapping with ``topic``,
    ``payload`` and any option of :meth:`publish`. Returns the ids in order."""
    batch = build_batch(messages, defaults=broker.publish_defaults)
    return (yield from _insert(broker, batch, None, conn)) if batch else []


def send(
    broker: BrokerBase,
    queue: str,
    payload: Any,
    *,
    conn: CallerConnection | None = None,
    **options: Unpack[PublishOptions],
) -> Plan[str]:
    """Point-to-point: deliver to the subscription named ``queue`` only, creating it on
    first use (in the same transaction). Same options as :meth:`publish`."""
    validate_topic(queue, "queue")
    message = build_message(queue, payload, defaults=broker.publish_defaults, **_known(options))
    ids = yield from _insert(broker, [message], queue, conn)
    return ids[0]


def send_many(
    broker: BrokerBase,
    queue: str,
    payloads: Iterable[Any],
    *,
    conn: CallerConnection | None = None,
    **options: Unpack[PublishOptions],
) -> Plan[list[str]]:
    """Send a batch of payloads to ``queue`` in one transaction, sharing the options of
    :meth:`send`."""
    validate_topic(queue, "queue")
    options = _known(options)
    batch = build_batch(payloads, defaults=broker.publish_defaults, topic=queue, options=options)
    return (yield from _insert(broker, batch, queue, conn)) if batch else []


def _known(options: PublishOptions) -> PublishOptions:
    """``options``, refused if a key is not a publish option (``**options`` takes any)."""
    if options:
        validate.known_options(options, PUBLISH_OPTIONS, "publish")
    return options


def _insert(
    broker: BrokerBase, messages: Sequence[NewMessage], queue: str | None, conn: CallerConnection
) -> Plan[list[str]]:
    hooks = broker._header_hooks
    result = yield call(
        "message_insert_many",
        conn=conn,
        messages=with_headers(messages, hooks) if hooks else messages,
        subscription=queue,
        max_copies=broker.limits.max_copies,
    )
    if conn is None:
        broker._published(queue)
    ids: list[str] = result.message_ids
    return ids


def subscribe(
    broker: BrokerBase, name: str, patterns: str | Sequence[str], *, replace: bool = False
) -> Plan[Subscription]:
    """Create the subscription ``name`` (or add patterns to it). From now on it gets its
    own copy of every message published to a matching topic. ``replace=True`` sets the
    patterns to exactly ``patterns``."""
    validate_topic(name, "name")
    replace = validate.flag(replace, "replace")
    checked = validate_patterns(patterns, "patterns")
    if len(checked) > PATTERNS_PER_SUBSCRIPTION:
        raise InvalidOption(
            "patterns", f"a subscription has at most {PATTERNS_PER_SUBSCRIPTION} patterns"
        )
    created: Subscription = yield call(
        "subscription_upsert", name=name, patterns=checked, replace=replace
    )
    return created


def unsubscribe(broker: BrokerBase, name: str) -> Plan[bool]:
    """Delete a subscription and its pending messages (dead letters and archive stay)."""
    validate_topic(name, "name")
    deleted: bool = yield call("subscription_delete", name=name)
    return deleted


def subscriptions(broker: BrokerBase) -> Plan[list[Subscription]]:
    """Every subscription, with its patterns (:class:`~sqlbroker.Subscription`)."""
    found: list[Subscription] = yield call("subscription_list")
    return found


def pause(
    broker: BrokerBase, name: str, *, actor: str | None = None, note: str | None = None
) -> Plan[None]:
    """Stop claims on subscription ``name`` until :meth:`resume`, for every worker and
    across restarts: publishes are still accepted, running handlers finish. Recorded in
    the audit trail (``actor`` defaults to ``api:<user>``); ``NotFound`` for an
    unknown subscription."""
    yield _set_paused(name, True, actor, note)


def resume(
    broker: BrokerBase, name: str, *, actor: str | None = None, note: str | None = None
) -> Plan[None]:
    """Let workers claim from ``name`` again (see :meth:`pause`)."""
    yield _set_paused(name, False, actor, note)


def _set_paused(name: str, paused: bool, actor: str | None, note: str | None) -> Any:
    validate_topic(name, "name")
    return call(
        "subscription_pause",
        name=name,
        paused=paused,
        actor=validate.actor(actor),
        note=None if note is None else validate.reason(note, "note"),
    )


def forget(broker: BrokerBase, scope: str, key: str | int) -> Plan[bool]:
    """Delete a processed key (:meth:`once`) whatever its state, so its effect may run
    again."""
    validate_topic(scope, "scope")
    forgotten: bool = yield call("processed_forget", scope=scope, key=processed_key(key))
    return forgotten
