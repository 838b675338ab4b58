"""Messages, deliveries and the records they leave behind, as plain immutable rows."""

from __future__ import annotations

import os
import sys
import time
import traceback as traceback_module
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum, StrEnum
from itertools import repeat
from typing import Any, overload


class Priority(IntEnum):
    """Named priorities; any integer 0–9 is valid and 0 is the most urgent."""

    URGENT = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3


URGENT, HIGH, NORMAL, LOW = Priority.URGENT, Priority.HIGH, Priority.NORMAL, Priority.LOW


class State(StrEnum):
    """States of a subscription's copy while it is in the hot table."""

    AVAILABLE = "available"
    """Claimable now (``available_at`` has passed)."""
    SCHEDULED = "scheduled"
    """Waiting for ``available_at``: delayed, or backing off before a retry."""
    BLOCKED = "blocked"
    """Behind an earlier message with the same ordering key."""
    RUNNING = "running"
    """Leased to a consumer."""


class Outcome(StrEnum):
    """How a copy left the hot table for the archive."""

    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    UNROUTED = "unrouted"


def new_message_id() -> str:
    """A time-ordered UUID (version 7 layout, RFC 9562) as text: sortable, unique,
    index-friendly. Its 48-bit millisecond prefix, then 74 random bits around the version
    (7) and the variant (0b10)."""
    # Twenty random hex digits, of which 18 and 2 bits of one more are used: the variant
    # digit is 0b10 and that digit's two low bits.
    digits = os.urandom(10).hex()
    return f"{_clock_head()}-7{digits[:3]}-{_VARIANT[digits[3]]}{digits[4:7]}-{digits[7:19]}"


_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
"""A random hex digit to the variant digit (0b10) with its two low bits."""


def _clock_head() -> str:
    """The first two groups of a message id made now: its millisecond clock reading."""
    millis = (time.time_ns() // 1_000_000 & (1 << 48) - 1).to_bytes(6, "big").hex()
    return f"{millis[:8]}-{millis[8:]}"


def new_message_ids(count: int) -> list[str]:
    """``count`` ids of :func:`new_message_id`'s kind, made together: one clock reading
    (their 48-bit millisecond prefix) and one read of 74 random bits each, in ascending
    order. Sorted, a batch's copies have ascending message ids as they have ascending row
    ids, so that removing a run of consecutive copies (a claim's, then its complete)
    changes one or two pages of each ``message_id`` index, not one per copy (the SQLite
    drain's complete of 10: 8.9 pages of the hot table's index and 3.2 of the archive's,
    for 2.3 and 1.8 with ids made one by one)."""
    # Made a batch at a time by C loops, not an id at a time in Python (half the work for
    # a batch, more for one id: new_message_id): four random bytes per id take the version
    # and the variant by masks over all of them, their hex is split at each two bytes into
    # the third and fourth groups, six more random bytes each make the fifth.
    if not count:
        return []
    size = 4 * count
    random = os.urandom(10 * count)
    keep = int.from_bytes(_RANDOM_BITS * count, "big")
    fixed = int.from_bytes(_FIXED_BITS * count, "big")
    marked = int.from_bytes(random[:size], "big") & keep | fixed
    groups = marked.to_bytes(size, "big").hex("-", 2).split("-")
    tails = random[size:].hex("-", 6).split("-")
    heads = repeat(_clock_head(), count)
    ids = list(map("-".join, zip(heads, groups[::2], groups[1::2], tails, strict=True)))
    ids.sort()
    return ids


_RANDOM_BITS = (0x0FFF3FFF).to_bytes(4, "big")
"""The random bits of an id's third and fourth groups (``7xxx-Vxxx``)."""
_FIXED_BITS = (0x70008000).to_bytes(4, "big")
"""The fixed bits of an id's third and fourth groups: the version (7) and the variant
(0b10)."""


def storable_text(text: str) -> str:
    """``text`` as every text column stores it: a NUL (which PostgreSQL refuses) shown as
    ``\\x00`` and a lone surrogate (which is not UTF-8) as its backslash escape, so
    that error texts from any exception can be written and read back on both backends."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What went wrong: the exception type, its message and a truncated traceback.

    The texts are made storable (:func:`storable_text`) and then bounded."""

    type: str
    message: str
    traceback: str | None = None

    MAX_TYPE = 200
    MAX_MESSAGE = 2_000
    MAX_TRACEBACK = 8_000
    TRUNCATED = "…(truncated)\n"

    def __post_init__(self) -> None:
        # Bounded however the ErrorInfo was made (from_exception, or by hand for
        # dead_letter(error=…)): what is stored, shown and exported stays small.
        # Cut before and after making the text storable: escapes make it longer.
        kind = storable_text(str(self.type)[: self.MAX_TYPE])[: self.MAX_TYPE]
        message = storable_text(str(self.message)[: self.MAX_MESSAGE])[: self.MAX_MESSAGE]
        object.__setattr__(self, "type", kind)
        object.__setattr__(self, "message", message)
        if self.traceback is not None:
            text = str(self.traceback)
            longest = self.MAX_TRACEBACK + len(self.TRUNCATED)
            cut = len(text) > longest
            text = storable_text(text[-self.MAX_TRACEBACK :] if cut else text)
            if cut or len(text) > longest:
                # Keep the tail: the innermost frames and the exception line say the most.
                text = self.TRUNCATED + text[-self.MAX_TRACEBACK :]
            object.__setattr__(self, "traceback", text)

    @classmethod
    def from_exception(cls, error: BaseException) -> ErrorInfo:
        """The exception's type name, message and formatted traceback."""
        kind = type(error)
        name = error_type_name(kind)
        try:
            message = str(error)
        except Exception:  # a broken __str__ must not lose the failure it describes
            message = f"<{name}: str() of the exception failed>"
        text = "".join(traceback_module.format_exception(error))
        return cls(type=name, message=message, traceback=text)

    @classmethod
    def coerce(cls, error: BaseException | str | ErrorInfo | None) -> ErrorInfo | None:
        """An ``ErrorInfo`` from an exception, a text (type ``"str"``) or one already made;
        ``None`` stays ``None``."""
        if error is None or isinstance(error, ErrorInfo):
            return error
        if isinstance(error, BaseException):
            return cls.from_exception(error)
        return cls(type="str", message=str(error)[: cls.MAX_MESSAGE])


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A validated, encoded message on its way into storage.

    ``delay``/``ttl`` are seconds relative to the storage clock; ``available_at`` and
    ``expires_at`` are absolute and win when given. With ``replace`` the message takes
    the place of its ordering key's pending copy of the same topic in each subscription
    (docs/flow-control.md, "Debounce and replace"); ``debounce`` (then also ``delay``)
    pushes that copy's available time to now + ``debounce``, never past its first enqueue
    + ``debounce_max``.
    """

    message_id: str
    topic: str
    payload: bytes
    content_type: str
    headers: str | None
    priority: int
    ordering_key: str | None
    idempotency_key: str | None
    payload_hash: str | None
    delay: float | None
    available_at: datetime | None
    ttl: float | None
    expires_at: datetime | None
    max_attempts: int
    dedupe_window: float
    replace: bool = False
    debounce: float | None = None
    debounce_max: float | None = None


def thawed(frozen: type) -> type:
    """A class with the slots of the frozen, slotted dataclass ``frozen`` and none of its
    frozenness: an instance's fields are set as plain attributes, then its ``__class__``
    becomes ``frozen`` (the same slots, so it may change), and it is a ``frozen`` like any
    other (type, equality, repr, frozenness, ``replace``, pickling). A frozen dataclass's
    ``__init__`` sets every field through ``object.__setattr__``, which costs several
    times more. A field left unset stays an empty slot: reading it raises
    ``AttributeError``."""
    return type(f"Thawed{frozen.__name__}", (), {"__slots__": vars(frozen)["__slots__"]})


_ThawedNewMessage = thawed(NewMessage)


def new_message_draft() -> Any:
    """A :class:`NewMessage` to fill in, field by field as attributes (a name that is not
    a field raises ``AttributeError``), then to hand to :func:`finish_message`. A publish
    makes one per message: cheaper than the frozen dataclass's ``__init__``
    (:func:`thawed`) and than a call of eighteen keywords."""
    return _ThawedNewMessage()


def finish_message(draft: Any) -> NewMessage:
    """``draft`` (of :func:`new_message_draft`), every field set, as the
    :class:`NewMessage` it now is."""
    draft.__class__ = NewMessage
    return draft  # type: ignore[no-any-return]


_OWN = ("message_id", "payload", "content_type", "payload_hash")
"""The fields of a :class:`SharedBatch`'s message that each has of its own."""


class SharedBatch(Sequence[NewMessage]):
    """Messages that share every field of ``template`` but the four of their own
    (:data:`_OWN`, given as columns): a batch sharing its options (``send_many``).

    It is a sequence of :class:`NewMessage`, each made when it is read; :meth:`column`
    reads a field of every message without making one (storage's batch insert), so a
    batch of hundreds costs no object per message."""

    __slots__ = ("_columns", "_count", "template")

    def __init__(
        self,
        template: NewMessage,
        message_ids: list[str],
        payloads: list[bytes],
        content_types: list[str],
        payload_hashes: list[str | None],
    ) -> None:
        self.template = template
        self._count = len(message_ids)
        columns: dict[str, list[Any]] = dict(
            zip(_OWN, (message_ids, payloads, content_types, payload_hashes), strict=True)
        )
        if any(len(values) != self._count for values in columns.values()):
            raise ValueError("the columns of a SharedBatch differ in length")
        self._columns = columns

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> NewMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[NewMessage]: ...

    def __getitem__(self, index: int | slice) -> NewMessage | list[NewMessage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        return message_like(self.template, *(values[index] for values in self._columns.values()))

    def __iter__(self) -> Iterator[NewMessage]:
        template = self.template
        for own in zip(*self._columns.values(), strict=True):
            yield message_like(template, *own)

    def column(self, name: str) -> list[Any]:
        """Field ``name`` of every message, in order (a new list)."""
        own = self._columns.get(name)
        if own is not None:
            return list(own)
        return [getattr(self.template, name)] * self._count


def message_like(
    template: NewMessage,
    message_id: str,
    payload: bytes,
    content_type: str,
    payload_hash: str | None,
) -> NewMessage:
    """``template`` with the four fields a message has of its own (:data:`_OWN`)
    replaced: :func:`dataclasses.replace` at a fraction of its cost (a draft, no
    ``__init__``)."""
    message = new_message_draft()
    for name in _SHARED:
        setattr(message, name, getattr(template, name))
    message.message_id = message_id
    message.payload = payload
    message.content_type = content_type
    message.payload_hash = payload_hash
    return finish_message(message)


_SHARED = tuple(name for name in NewMessage.__slots__ if name not in _OWN)
"""The fields a :class:`SharedBatch`'s messages share (all but :data:`_OWN`)."""


def message_column(messages: Sequence[NewMessage], name: str) -> list[Any]:
    """Field ``name`` of every message of ``messages``, in order: of a
    :class:`SharedBatch` without making its messages."""
    # A list first: an isinstance test of the ABC costs more than the column of one message.
    if type(messages) is not list and isinstance(messages, SharedBatch):
        return messages.column(name)
    return [getattr(message, name) for message in messages]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One subscription's copy of a message, leased to the caller by a claim.

    ``attempt`` counts claims including this one. ``lease_token`` proves the lease: an
    ack, retry, dead-letter or extend with a stale token raises ``LeaseLost``.
    """

    id: int
    message_id: str
    subscription: str
    topic: str
    payload: Any
    content_type: str
    headers: dict[str, str]
    priority: int
    key: str | None
    idempotency_key: str | None
    attempt: int
    max_attempts: int
    replay_count: int
    enqueued_at: datetime
    available_at: datetime
    expires_at: datetime | None
    lease_token: str
    lease_expires_at: datetime


@dataclass(frozen=True, slots=True)
class PendingMessage:
    """A copy in the hot table, as shown by admin views (no lease token)."""

    id: int
    message_id: str
    subscription: str
    topic: str
    state: State
    priority: int
    key: str | None
    attempts: int
    max_attempts: int
    enqueued_at: datetime
    available_at: datetime
    expires_at: datetime | None
    lease_expires_at: datetime | None
    last_error: str | None
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns (stand-in values fill them);
    ``None`` for a sound row. See docs/security.md, "Damaged rows"."""


def _exported(name: str) -> type | None:
    """The class ``sqlbroker.<name>`` when the package exports one (looked up in the
    loaded package, never imported from here: core imports nothing of ours)."""
    package = sys.modules.get("sqlbroker")
    found = getattr(package, name, None) if package is not None and name.isidentifier() else None
    return found if isinstance(found, type) else None


def error_type_name(kind: type[BaseException]) -> str:
    """How an exception's type is stored and shown: ``ValueError`` for builtins,
    ``sqlbroker.Reject`` for a class the package exports (not the module it lives in),
    ``module.Qualified`` for everything else."""
    if kind.__module__ == "builtins":
        return kind.__qualname__
    if kind.__module__.startswith("sqlbroker.") and _exported(kind.__qualname__) is kind:
        return f"sqlbroker.{kind.__qualname__}"
    return f"{kind.__module__}.{kind.__qualname__}"


def public_error_type(stored: str | None) -> str | None:
    """``stored`` with the full path of an exported sqlbroker class shortened to its
    public name (rows written before the public names: ``sqlbroker.core.policies.Reject``)."""
    if stored is None or not stored.startswith("sqlbroker.") or stored.count(".") < 2:
        return stored
    kind = _exported(stored.rsplit(".", 1)[1])
    if kind is not None and f"{kind.__module__}.{kind.__qualname__}" == stored:
        return f"sqlbroker.{kind.__qualname__}"
    return stored


def error_type_matches(name: str) -> tuple[list[str], str]:
    """What a filter on error type ``name`` matches: the exact names (``name``, and for a
    sqlbroker class both its public name and its full path, since older rows hold the
    latter) and a suffix (``.name``), so that ``Reject`` finds ``sqlbroker.Reject`` and
    ``myapp.errors.Reject`` alike."""
    exact = [name]
    public = public_error_type(name)
    if public is not None and public != name:
        exact.append(public)
    elif name.startswith("sqlbroker.") and name.count(".") == 1:
        kind = _exported(name.split(".", 1)[1])
        if kind is not None:
            exact.append(f"{kind.__module__}.{kind.__qualname__}")
    return exact, f".{name}"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A copy that failed for good, with the whole original message and why it died.
    ``error_type`` is the exception's public name (``sqlbroker.Reject``), also for rows
    stored under its module's path."""

    id: int
    message_id: str
    subscription: str
    topic: str
    payload: Any
    content_type: str
    headers: dict[str, str]
    priority: int
    key: str | None
    idempotency_key: str | None
    attempts: int
    max_attempts: int
    replay_count: int
    reason: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    enqueued_at: datetime
    first_started_at: datetime | None
    first_failed_at: datetime
    last_failed_at: datetime
    dead_at: datetime
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns (stand-in values fill them);
    ``None`` for a sound row. See docs/security.md, "Damaged rows"."""

    def __post_init__(self) -> None:
        public = public_error_type(self.error_type)
        if public != self.error_type:
            object.__setattr__(self, "error_type", public)


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A finished copy: completed, expired, cancelled, or a publish nobody subscribed to."""

    id: int
    message_id: str
    subscription: str | None
    topic: str
    payload: Any
    content_type: str
    headers: dict[str, str]
    priority: int
    key: str | None
    outcome: Outcome
    attempts: int
    replay_count: int
    enqueued_at: datetime
    first_started_at: datetime | None
    finished_at: datetime
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns (stand-in values fill them);
    ``None`` for a sound row. See docs/security.md, "Damaged rows"."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """A named queue: every message published to a topic matching one of its ``patterns``
    gets a copy here (:meth:`Broker.subscribe`)."""

    name: str
    patterns: tuple[str, ...]
    created_at: datetime
    damaged: str | None = None
    """Why this stored row did not decode, naming its columns (stand-in values fill them);
    ``None`` for a sound row. See docs/security.md, "Damaged rows"."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a subscription's archive rows and dead letters are kept, in seconds: its own
    time, or the broker's default (``archive_default``/``dead_default`` say which)."""

    subscription: str
    archive: float
    dead: float
    archive_default: bool
    dead_default: bool


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """A subscription at one instant. Ages and handler times are in seconds.

    Rates are per minute, averaged over the recent window ``Broker.stats`` was asked for
    (five minutes by default), from what workers recorded; handler times are estimated from
    their histogram. ``expired`` counts expired copies still in the archive."""

    subscription: str
    ready: int
    scheduled: int
    running: int
    blocked: int
    dead: int
    oldest_ready_age: float | None
    completed_per_minute: float = 0.0
    retried_per_minute: float = 0.0
    dead_per_minute: float = 0.0
    handler_p50: float | None = None
    handler_p95: float | None = None
    expired: int = 0
    archive_retention: float | None = None
    """Seconds its finished copies are kept in the archive (its own or the default)."""
    dead_retention: float | None = None
    """Seconds its dead letters are kept (its own or the default)."""
    paused: bool = False
    """Whether claims are paused (``Broker.pause``): publishes still queue up."""
    throttled: bool = False
    """Whether its flow limits hold claims back now (``Broker.set_flow``): its rate limit,
    or ``max_running`` copies running."""
    throttled_for: float = 0.0
    """Seconds until its rate limit lets the next claim through (0: now)."""
    replaced: int = 0
    """Publishes that took the place of a pending copy (``replace=True``, ``debounce=``),
    since the database was created."""
