"""The exception tree of the public API.

Every failure a caller can see is a subclass of :class:`SqlbrokerError`. Driver exceptions
(``sqlite3``, ``psycopg``) are translated at the storage boundary and never escape it.
"""

from __future__ import annotations

from collections.abc import Sequence


class SqlbrokerError(Exception):
    """Base class of every error raised by sqlbroker."""


class ValidationError(SqlbrokerError, ValueError):
    """Bad input, detected in Python before any SQL runs; nothing was written.

    ``field`` names the offending argument (``"topic"``, ``"payload"``, ``"priority"``, …).
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InvalidName(ValidationError):
    """A topic, queue, subscription or pattern name breaks the naming rules."""


class InvalidPayload(ValidationError):
    """A payload is not plain JSON (or bytes), or is larger than the limit."""


class InvalidHeaders(ValidationError):
    """Headers are not a mapping of short strings to short strings."""


class InvalidPriority(ValidationError):
    """A priority outside 0–9."""


class InvalidDuration(ValidationError):
    """A delay, TTL, lease or window that is negative, not finite, or too large."""


class InvalidTime(ValidationError):
    """A point in time that is naive, out of range or otherwise unusable."""


class InvalidSchedule(ValidationError):
    """A cron expression, interval, time zone or missed policy that makes no schedule."""


class InvalidOption(ValidationError):
    """Any other argument outside its documented range (limits, batch sizes, options)."""


class LimitExceeded(ValidationError):
    """A publish or subscribe would pass one of the broker's limits; nothing was written.

    ``field`` names the limit, which is also the :class:`~sqlbroker.Broker` option that
    raises it (``max_copies``, ``max_subscriptions``, ``max_patterns``; patterns per
    subscription are fixed); ``limit`` is its value, ``wanted`` what was asked for."""

    def __init__(self, field: str, problem: str, *, limit: int, wanted: int) -> None:
        self.limit = limit
        self.wanted = wanted
        super().__init__(field, problem)


class ConfigurationError(SqlbrokerError):
    """The broker cannot be set up as asked (bad URL, missing extra, refused filesystem).

    Retrying changes nothing: the configuration must be fixed first.
    """


class AuthenticationError(ConfigurationError):
    """The database refused the login: wrong password, unknown role, or no entry in the
    server's access rules for it. Not transient, so never retried."""


class InvalidURL(ValidationError, ConfigurationError):
    """A database URL that cannot be used as written (malformed, an unknown scheme, an
    option sqlbroker does not honour). Bad input and a configuration error at once; the
    message shows the URL only with its password replaced by ``***``."""

    def __init__(self, problem: str) -> None:
        super().__init__("url", problem)


class SchemaError(SqlbrokerError):
    """The database schema is missing, older or newer than this version of sqlbroker."""


class NotFound(SqlbrokerError, LookupError):
    """The named message, dead letter or subscription does not exist."""


class LeaseLost(SqlbrokerError):
    """An ack, nack or extend carried a lease token that is no longer valid.

    The lease expired and the message may have been claimed again; nothing was changed for
    the listed deliveries. ``delivery_ids`` names them.
    """

    def __init__(self, delivery_ids: Sequence[int]) -> None:
        self.delivery_ids = tuple(delivery_ids)
        shown = ", ".join(str(i) for i in self.delivery_ids[:10])
        more = "" if len(self.delivery_ids) <= 10 else f" and {len(self.delivery_ids) - 10} more"
        super().__init__(
            f"lease lost for deliveries {shown}{more}: the lease expired or was taken over;"
            " nothing was changed for them"
        )


class IdempotencyConflict(SqlbrokerError):
    """An idempotency key was reused, inside its window, with a different message."""

    def __init__(self, topic: str, idempotency_key: str, message_id: str) -> None:
        self.topic = topic
        self.idempotency_key = idempotency_key
        self.message_id = message_id
        super().__init__(
            f"idempotency key {idempotency_key!r} on topic {topic!r} was already used for"
            f" message {message_id} with a different payload"
        )


class StorageError(SqlbrokerError):
    """The database refused or failed an operation (the driver's message is kept)."""


def undone(committed: bool, nothing: str) -> str:
    """What an operation that failed at a statement left behind, as its error says it:
    ``nothing`` (that error's words for "nothing was written", with its advice), unless
    statements of the operation before the failed one had committed on their own
    (``committed``: PostgreSQL runs a write's statements alone unless it must apply all or
    nothing; SQLite's claim commits before it dead-letters the rows that do not decode).
    Then what they did stands, and trying again does not do it twice: only an operation
    written so runs outside a transaction (``storage.plan.Access``) — a claim's leased
    copies come back when their leases expire, a worker's beat adds its counters last,
    a reaper's pass finds only what is left — while a publish of several statements (a
    batch with keys, a new queue) is one transaction, undone whole. The one rule for
    :class:`DatabaseBusy` and :class:`StorageFull`."""
    if not committed:
        return nothing
    return (
        "this statement changed nothing, but the operation's statements before it had"
        " committed on their own, so it may be partly done: what they did stands, and is"
        " not done twice by trying again"
    )


class DatabaseBusy(StorageError):
    """The database was locked: longer than the busy timeout, or in a conflict SQLite
    answers at once (the message says which); on PostgreSQL a lock held by another session
    longer than ``lock_timeout``, or a statement past ``statement_timeout``. Nothing was
    written — but by the earlier statements of an operation that commits each on its own,
    which the message then says (:func:`undone`); trying again later is safe."""


class StorageFull(StorageError):
    """The database's disk is full: nothing was written (but by the earlier statements of
    an operation that commits each on its own, which stand and are not done twice by a
    retry, as the message then says in :func:`undone`'s words), and the same call
    succeeds once space is freed (nothing has to be restarted).

    Raised alike by both backends: PostgreSQL's ``disk_full`` (SQLSTATE 53100: a table,
    index or temporary file could not grow) and SQLite's ``SQLITE_FULL`` (the database
    file, its WAL or its shared-memory file could not grow). ``backend`` is
    ``"PostgreSQL"`` or ``"SQLite"``, ``detail`` the database's own words. Inside a
    caller's transaction (``conn=``) that transaction is lost with it (PostgreSQL aborts
    it; SQLite may roll it back). A PostgreSQL server that cannot write its WAL crashes
    instead, and stays down while its disk is full: callers see ``ConnectionLost`` then,
    as for any other server crash."""

    def __init__(self, backend: str, detail: str, *, committed: bool = False) -> None:
        self.backend = backend
        self.detail = detail
        left = undone(committed, "nothing was written, try again")
        super().__init__(
            f"the {backend} database's disk is full; {left} once space is freed ({detail})"
        )


class ConnectionLost(StorageError):
    """The connection to the database failed during an operation.

    ``ambiguous`` is true when a write may or may not have committed (the connection broke
    after the statement or the commit was sent). Retrying a publish with the same
    idempotency key is then safe; retrying without one may publish twice. ``write`` says
    whether the operation was a write: only then does the message tell the outcome
    (``outcome unknown`` or ``outcome not applied``), since a read has none.
    """

    def __init__(self, message: str, *, ambiguous: bool, write: bool = True) -> None:
        self.ambiguous = ambiguous
        self.write = write or ambiguous
        outcome = "unknown" if ambiguous else "not applied"
        super().__init__(f"{message} (outcome {outcome})" if self.write else message)


class ReservationLost(SqlbrokerError):
    """A processed key's reservation ran out before it was confirmed or extended, and
    another consumer may have taken the key over: the effect may run twice."""

    def __init__(self, scope: str, key: str) -> None:
        self.scope = scope
        self.key = key
        super().__init__(
            f"the reservation of processed key {scope}/{key} ran out before it was confirmed;"
            " another consumer may have taken it over (use a longer lease or extend())"
        )
