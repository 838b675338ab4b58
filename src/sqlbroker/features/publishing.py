"""Turning a publish call into a validated, encoded :class:`NewMessage`.

Everything here runs before any SQL: a bad argument raises a ``ValidationError`` subclass
naming the field and nothing is written, identically on every backend.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict, cast

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidDuration, InvalidHeaders, InvalidOption, InvalidTime
from sqlbroker.core.message import (
    NORMAL,
    NewMessage,
    SharedBatch,
    finish_message,
    message_like,
    new_message_draft,
    new_message_id,
    new_message_ids,
)
from sqlbroker.core.serde import JSON_CONTENT_TYPE, encode_json, encode_payload, encode_plain
from sqlbroker.core.topics import validate_topic
from sqlbroker.storage.rows import payload_hash


class MessageOptions(TypedDict, total=False):
    """The options a message carries whoever publishes it: a publish
    (:class:`PublishOptions`) or a schedule's ticks (``ScheduleOptions``). Unset, each is
    ``None`` (none) unless said."""

    key: str | None
    """The ordering key: copies with one key are handed out one at a time, in order."""
    priority: int
    """0 (most urgent, ``URGENT``) to 9; claimed lower first (default ``NORMAL``, 2)."""
    ttl: float | timedelta | None
    """Expires this long after the database's now (or at ``expires_at``)."""
    max_attempts: int | None
    """Deliveries before the message is dead-lettered (default: the broker's)."""
    headers: Mapping[str, str] | None
    """Text headers carried with the message."""
    content_type: str | None
    """The payload's type: a JSON value is ``application/json``; ``bytes`` pass through
    labelled with this (default ``application/octet-stream``)."""


MESSAGE_OPTIONS = MessageOptions.__optional_keys__


class PublishOptions(MessageOptions, total=False):
    """The options of a publish (``publish``, ``send``, ``send_many``, an item of
    ``publish_many``), every one optional: those of :class:`MessageOptions` and these;
    unset, each is ``None`` (none) unless said. Durations take seconds or a
    :class:`~datetime.timedelta`."""

    replace: bool
    """With ``key``: take the place of the key's pending copy of the same topic, if one
    was never claimed, instead of queueing another (default ``False``)."""
    debounce: float | timedelta | None
    """With ``key``; implies ``replace``: wait until this long after the last publish."""
    debounce_max: float | timedelta | None
    """With ``debounce``: never wait longer than this after the copy was first enqueued."""
    delay: float | timedelta | None
    """Available this long after the database's now (or ``at`` a point in time)."""
    at: datetime | None
    """Available from this point in time."""
    expires_at: datetime | None
    """Expires at this point in time, delivered or not."""
    idempotency_key: str | None
    """A repeat within ``dedupe_window`` returns the first message's id, writing nothing."""
    dedupe_window: float | timedelta | None
    """How long an idempotency key is remembered (default: the broker's)."""


PUBLISH_OPTIONS = PublishOptions.__optional_keys__


@dataclass(frozen=True, slots=True)
class PublishDefaults:
    """Broker-wide defaults applied to every publish."""

    max_attempts: int
    dedupe_window: float
    payload_limit: int


def build_message(
    topic: object,
    payload: Any,
    *,
    defaults: PublishDefaults,
    key: object = None,
    priority: object = NORMAL,
    delay: object = None,
    at: object = None,
    ttl: object = None,
    expires_at: object = None,
    max_attempts: object = None,
    headers: object = None,
    idempotency_key: object = None,
    dedupe_window: object = None,
    content_type: object = None,
    replace: object = False,
    debounce: object = None,
    debounce_max: object = None,
    field_prefix: str = "",
) -> NewMessage:
    """Validate one publish and encode it."""
    # A bound method, not a function of ours: a publish names every field it checks.
    name: Callable[[str], str] = f"{field_prefix}{{}}".format

    topic_text = validate_topic(topic, name("topic"))
    if content_type is not None and not isinstance(content_type, str):
        raise InvalidOption(name("content_type"), "must be a string")
    data, kind = _encode(payload, content_type, defaults.payload_limit, field_prefix)
    if delay is not None and at is not None:
        raise InvalidOption(name("at"), "give delay or at, not both")
    if ttl is not None and expires_at is not None:
        raise InvalidOption(name("expires_at"), "give ttl or expires_at, not both")
    # An option left unset is not handed to its check (nor its field named): most are.
    delay_s = None if delay is None else validate.seconds(delay, name("delay"))
    ordering_key = None if key is None else validate.key(key, name("key"))
    replacing, debounce_s, debounce_max_s = (
        (False, None, None)  # the defaults, nothing to check
        if replace is False and debounce is None and debounce_max is None
        else _replace_options(
            replace, debounce, debounce_max, keyed=ordering_key is not None, name=name
        )
    )
    if debounce_s is not None:
        if delay is not None or at is not None:
            raise InvalidOption(name("debounce"), "give debounce or delay/at, not both")
        # A debounced message that replaces nothing waits debounce, as a delay would.
        delay_s = debounce_s
    ttl_s = None if ttl is None else validate.seconds(ttl, name("ttl"))
    if ttl_s == 0:
        raise InvalidDuration(name("ttl"), "must be greater than zero")
    at_dt = None if at is None else validate.point_in_time(at, name("at"))
    expires_dt = (
        None if expires_at is None else validate.point_in_time(expires_at, name("expires_at"))
    )
    # A message that would expire before it becomes available is refused where both ends
    # are known here: relative to relative, absolute to absolute. A relative end counts
    # from the storage clock's now (DESIGN §2.9), which is not known before SQL, so ``at``
    # with ``ttl`` and ``delay`` with ``expires_at`` are not compared (documented in
    # Broker.publish and docs/guarantees.md).
    if delay_s is not None and ttl_s is not None and ttl_s <= delay_s:
        raise InvalidDuration(name("ttl"), "the message would expire before its delay ends")
    if at_dt is not None and expires_dt is not None and expires_dt <= at_dt:
        raise InvalidTime(
            name("expires_at"), "the message would expire before it becomes available"
        )
    attempts = (
        defaults.max_attempts
        if max_attempts is None
        else validate.integer(
            max_attempts, name("max_attempts"), minimum=1, maximum=validate.MAX_ATTEMPTS
        )
    )
    window = (
        defaults.dedupe_window
        if dedupe_window is None
        else validate.seconds(dedupe_window, name("dedupe_window"), allow_zero=False)
    )
    idem = (
        None if idempotency_key is None else validate.key(idempotency_key, name("idempotency_key"))
    )
    header_map = None if headers is None else validate.headers(headers, name("headers"))
    message = new_message_draft()
    message.message_id = new_message_id()
    message.topic = topic_text
    message.payload = data
    message.content_type = kind
    message.headers = None if header_map is None else encode_json(header_map)
    message.priority = (
        _NORMAL if priority is NORMAL else validate.priority(priority, name("priority"))
    )
    message.ordering_key = ordering_key
    message.idempotency_key = idem
    message.payload_hash = None if idem is None else payload_hash(data, kind)
    message.delay = delay_s
    message.available_at = at_dt
    message.ttl = ttl_s
    message.expires_at = expires_dt
    message.max_attempts = attempts
    message.dedupe_window = window
    message.replace = replacing
    message.debounce = debounce_s
    message.debounce_max = debounce_max_s
    return finish_message(message)


_NORMAL = int(NORMAL)
"""The default priority as :func:`validate.priority` returns it (a plain ``int``)."""


def _encode(
    payload: Any, content_type: str | None, limit: int, where: str | int
) -> tuple[bytes, str]:
    """:func:`encode_payload`'s ``(data, content_type)``, by :func:`encode_plain` when
    ``payload`` is plain JSON (without the checks a payload of another kind needs).
    ``where`` is the field prefix of the payload's publish (``field_prefix``) or its index
    in a batch (``messages[i].``): its field's name is formatted only for an error, not
    for each message of a batch."""
    if content_type is None or content_type == JSON_CONTENT_TYPE:
        data = encode_plain(payload, limit)
        if data is not None:
            return data, JSON_CONTENT_TYPE
    field = f"messages[{where}].payload" if isinstance(where, int) else f"{where}payload"
    return encode_payload(payload, content_type=content_type, limit=limit, field=field)


def _replace_options(
    replace: object,
    debounce: object,
    debounce_max: object,
    *,
    keyed: bool,
    name: Callable[[str], str],
) -> tuple[bool, float | None, float | None]:
    """``(replace, debounce, debounce_max)`` checked: a debounce replaces (it implies
    ``replace``), both need an ordering key, a debounce is positive and its maximum wait
    at least as long."""
    replacing = validate.flag(replace, name("replace"))
    debounce_s = validate.optional_seconds(debounce, name("debounce"))
    if debounce_s == 0:
        raise InvalidDuration(name("debounce"), "must be greater than zero")
    debounce_max_s = validate.optional_seconds(debounce_max, name("debounce_max"))
    if debounce_max_s is not None:
        if debounce_s is None:
            raise InvalidOption(name("debounce_max"), "needs debounce (the wait it bounds)")
        if debounce_max_s < debounce_s:
            raise InvalidDuration(name("debounce_max"), "must be at least debounce")
    if debounce_s is not None:
        replacing = True
    if replacing and not keyed:
        option = "replace" if debounce_s is None else "debounce"
        raise InvalidOption(
            name(option), "needs an ordering key (key), whose pending copy it replaces"
        )
    return replacing, debounce_s, debounce_max_s


def build_batch(
    items: object,
    *,
    defaults: PublishDefaults,
    topic: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Sequence[NewMessage]:
    """Validate a batch: mappings with ``topic``/``payload`` and publish options, or (with
    ``topic`` given, for queues) bare payloads sharing ``options``."""
    if isinstance(items, str | bytes | Mapping) or not hasattr(items, "__iter__"):
        raise InvalidOption("messages", "must be a list (or other iterable) of messages")
    materialized = list(items)
    if not materialized:
        return []
    if len(materialized) > validate.MAX_BATCH:
        raise InvalidOption(
            "messages",
            f"a batch holds at most {validate.MAX_BATCH} messages, not {len(materialized)}",
        )
    if topic is not None:
        return _build_queue_batch(materialized, defaults=defaults, topic=topic, options=options)
    messages: list[NewMessage] = []
    # A message with nothing but a topic and a payload (the common item) is the first such
    # message of its topic with a payload and an id of its own: its topic is checked once.
    bare: dict[str, NewMessage] = {}
    ids = new_message_ids(len(materialized))
    limit = defaults.payload_limit
    for index, item in enumerate(materialized):
        topic = item.get("topic") if type(item) is dict and len(item) == 2 else None
        if type(topic) is str and "payload" in item:
            template = bare.get(topic)
            if template is not None:
                data, kind = _encode(item["payload"], None, limit, index)
                messages.append(message_like(template, ids[index], data, kind, None))
                continue
        prefix = f"messages[{index}]."
        if not isinstance(item, Mapping):
            raise InvalidOption(
                f"messages[{index}]", "must be a mapping with 'topic' and 'payload'"
            )
        unknown = set(item) - PUBLISH_OPTIONS - {"topic", "payload"}
        if unknown:
            raise InvalidOption(
                f"messages[{index}]", f"unknown fields: {', '.join(sorted(map(str, unknown)))}"
            )
        if "topic" not in item or "payload" not in item:
            raise InvalidOption(f"messages[{index}]", "needs both 'topic' and 'payload'")
        fields = {k: v for k, v in item.items() if k not in ("topic", "payload")}
        message = build_message(
            item["topic"], item["payload"], defaults=defaults, field_prefix=prefix, **fields
        )
        if not fields and type(item["topic"]) is str:
            bare.setdefault(item["topic"], message)
        messages.append(message)
    return messages


def _build_queue_batch(
    payloads: list[Any],
    *,
    defaults: PublishDefaults,
    topic: str,
    options: Mapping[str, Any] | None,
) -> SharedBatch:
    """Bare payloads sharing one set of options: the options are validated once, with the
    first message; every further message only encodes its payload (and gets its own id and,
    with an idempotency key, its own payload hash). Errors name the same fields as
    :func:`build_message` would."""
    shared = dict(options or {})
    first = build_message(
        topic, payloads[0], defaults=defaults, field_prefix="messages[0].", **shared
    )
    content_type = shared.get("content_type")
    limit = defaults.payload_limit
    keyed = first.idempotency_key is not None
    ids = [first.message_id, *new_message_ids(len(payloads) - 1)]
    count = len(payloads)
    kinds = [first.content_type] * count
    # Plain JSON (the common batch) is encoded in one comprehension, without _encode's call
    # and tuple per payload; a payload it does not take (None) goes through _encode.
    encoded: list[bytes | None] = [first.payload]
    if first.content_type == JSON_CONTENT_TYPE:
        encoded += [encode_plain(payload, limit) for payload in payloads[1:]]
    else:
        encoded += [None] * (count - 1)
    if None in encoded:
        for index, data in enumerate(encoded):
            if data is None:
                encoded[index], kinds[index] = _encode(payloads[index], content_type, limit, index)
    datas = cast("list[bytes]", encoded)
    hashes: list[str | None] = [None] * len(datas)
    if keyed:
        hashes = [payload_hash(data, kind) for data, kind in zip(datas, kinds, strict=True)]
    return SharedBatch(first, ids, datas, kinds, hashes)


def with_headers(
    messages: Sequence[NewMessage], hooks: Sequence[Callable[[], Mapping[str, str]]]
) -> Sequence[NewMessage]:
    """``messages`` with the headers the hooks return added where a message does not set
    them already; the hooks are called once for the whole batch. What a hook returns is
    held to the rules of user headers (``InvalidHeaders`` before anything is written), and
    so is each message's merged set (at most 64 headers)."""
    extra: dict[str, str] = {}
    for hook in hooks:
        try:
            added = validate.headers(hook(), "headers")
        except InvalidHeaders as error:
            raise InvalidHeaders("headers", f"a header hook returned: {error.problem}") from None
        extra.update(added or {})
    if not extra:
        return messages
    merged = []
    for message in messages:
        own = json.loads(message.headers) if message.headers else {}
        headers = {**extra, **own}
        if len(headers) > validate.MAX_HEADERS:
            raise InvalidHeaders(
                "headers",
                f"has {len(headers)} entries with those of the header hooks;"
                f" the limit is {validate.MAX_HEADERS}",
            )
        merged.append(dataclasses.replace(message, headers=encode_json(headers)))
    return merged
