"""The storage seam: queue operations, named noun-then-verb, batch-first, keyword-only.

Every backend implements :class:`Backend` and passes the one conformance suite in
``tests/conformance``. Differences between databases are capability flags
(``supports_notify``), never ``isinstance`` checks above this layer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlbroker.core.errors import InvalidOption
from sqlbroker.core.message import (
    ArchivedMessage,
    DeadLetter,
    Delivery,
    ErrorInfo,
    NewMessage,
    Outcome,
    PendingMessage,
    State,
    Subscription,
    SubscriptionStats,
    storable_text,
)
from sqlbroker.core.observability import (
    AuditEntry,
    MinuteCounts,
    RareCount,
    WorkerBeat,
    WorkerInfo,
)
from sqlbroker.core.results import ResultRecord
from sqlbroker.core.sagas import DueSaga, NewSaga, SagaInstance
from sqlbroker.core.validate import MAX_REASON
from sqlbroker.storage.rows import UndecodableRow
from sqlbroker.storage.schedules import (
    DueSchedules,
    ScheduleDefinition,
    ScheduleFire,
    ScheduleRecord,
)

if TYPE_CHECKING:
    from sqlbroker.storage.seam import AsyncExecutor, AsyncTx, Settings, Tx

log = logging.getLogger("sqlbroker.storage")


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of a claim: the delivery's id and the token its claim issued."""

    id: int
    token: str

    @classmethod
    def of(cls, delivery: Delivery) -> Lease:
        return cls(id=delivery.id, token=delivery.lease_token)


@dataclass(frozen=True, slots=True)
class RetryRequest:
    """Back to the queue after ``after`` seconds; a ``snooze`` gives the attempt back."""

    lease: Lease
    after: float
    error: ErrorInfo | None
    snooze: bool = False


@dataclass(frozen=True, slots=True)
class DeadRequest:
    """To the dead letters; ``reason`` is made storable (``storable_text``) and cut to
    ``MAX_REASON`` characters (a handler's ``Reject(reason)`` is not validated on the way)."""

    lease: Lease
    reason: str
    error: ErrorInfo | None

    def __post_init__(self) -> None:
        reason = storable_text(str(self.reason)[:MAX_REASON])[:MAX_REASON]
        object.__setattr__(self, "reason", reason)


def check_values(leases: Sequence[Lease], values: Sequence[bytes | None] | None) -> None:
    """``message_complete_many``'s ``values`` are aligned with its leases (checked before
    any SQL runs)."""
    if values is not None and len(values) != len(leases):
        raise InvalidOption(
            "values", f"has {len(values)} entries for {len(leases)} leases: give one per lease"
        )


def undecodable_deaths(damaged: Sequence[UndecodableRow]) -> list[DeadRequest]:
    """Dead-letter requests for claimed rows that do not decode (reason ``undecodable``,
    error type ``sqlbroker.Undecodable``, the message naming the columns), each under the
    lease its claim issued; every claim path sends these to ``message_dead_many``."""
    for row in damaged:
        log.warning(
            "message %s does not decode (%s): dead-lettered",
            row.id,
            row.problem,
            extra={"delivery_id": row.id, "reason": "undecodable"},
        )
    return [
        DeadRequest(
            lease=Lease(id=row.id, token=row.lease_token), reason=row.reason, error=row.error
        )
        for row in damaged
    ]


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Selects dead letters; every given field must match (``None`` matches anything)."""

    ids: tuple[int, ...] | None = None
    subscription: str | None = None
    topic: str | None = None
    error_type: str | None = None
    reason_contains: str | None = None
    dead_before: datetime | None = None
    dead_after: datetime | None = None

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__slots__)


@dataclass(frozen=True, slots=True)
class ReapResult:
    released: int
    dead: int


@dataclass(frozen=True, slots=True)
class RetentionBounds:
    """The longest and shortest retentions (seconds) that subscriptions have of their own;
    ``None`` when none has one."""

    archive_longest: float | None
    archive_shortest: float | None
    dead_longest: float | None
    dead_shortest: float | None


@dataclass(frozen=True, slots=True)
class InsertResult:
    """The message id for each input, in order: a fresh id, or an earlier duplicate's id."""

    message_ids: list[str]
    duplicates: int
    unrouted: int


ROLE_GROUPS = ("migrator", "producer", "consumer", "reader", "operator")
"""The PostgreSQL group roles, ``<prefix>_<group>`` (see docs/security.md)."""


@dataclass(frozen=True, slots=True)
class TenantRole:
    """A login role and the tenant it acts for."""

    role: str
    tenant: str


class ResultWatch(Protocol):
    """A watch on one message's results (see :meth:`Backend.result_watch`)."""

    def wait(self, timeout: float) -> bool:
        """Block until a hint that the message's copies may have finished (``True``) or
        for ``timeout`` seconds (``False``). Hints can be lost: callers look up anyway."""


class AsyncResultWatch(Protocol):
    """:class:`ResultWatch` for coroutines."""

    async def wait(self, timeout: float) -> bool: ...


class Backend(Protocol):
    """Queue operations over one database. Thread-safe; blocking."""

    name: str
    supports_notify: bool
    notify_channel: str
    settings: Settings
    async_ops: AsyncExecutor
    """Every operation as a coroutine (PostgreSQL: on the running loop's async pool;
    SQLite: on the backend's own threads)."""

    def begin(self, conn: Any = None, *, timed: bool = True) -> AbstractContextManager[Tx]:
        """One transaction for several operations, each a method of the ``Tx``: the
        backend's own (committed when the block ends normally, rolled back otherwise), or
        with ``conn`` the caller's connection, joined as a savepoint, never committed."""

    def begin_async(
        self, conn: Any = None, *, timed: bool = True
    ) -> AbstractAsyncContextManager[AsyncTx]:
        """:meth:`begin` for coroutines."""

    # --- lifecycle -------------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply pending migrations (serialized across processes); return those applied."""

    def schema_version(self) -> int:
        """The applied schema version (0 for an empty database)."""

    def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the schema is exactly the version this code needs."""

    def now(self) -> datetime:
        """The storage clock's current time."""

    def close(self) -> None: ...

    async def listen_async(
        self,
        *,
        on_hint: Callable[[str | None], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        """Run until cancelled, calling ``on_hint(subscription)`` on the running loop when
        new work may be claimable there (``None``: anywhere), and (where the backend can
        announce them: PostgreSQL) ``on_cancel(subscription)`` when a running copy there
        was cancelled. Hints can be lost; callers poll as well.

        PostgreSQL: LISTEN/NOTIFY on a dedicated async connection, re-established with
        backoff, with ``on_hint(None)`` after every (re)connect. SQLite: ``PRAGMA
        data_version`` watched every 2 to 50 ms from a thread (more often while commits
        keep coming), which sees commits from every connection and process.
        """

    # --- subscriptions ---------------------------------------------------------------------
    def subscription_upsert(
        self, *, name: str, patterns: Sequence[str], replace: bool
    ) -> Subscription: ...

    def subscription_ensure(self, *, name: str) -> bool:
        """Create the queue ``name`` on first use: a subscription whose only pattern is its
        name. An existing subscription is left as it is. Returns whether it was created."""

    def subscription_list(self) -> list[Subscription]: ...

    def subscription_delete(self, *, name: str) -> bool: ...

    # --- messages --------------------------------------------------------------------------
    def message_insert_many(
        self,
        *,
        messages: Sequence[NewMessage],
        subscription: str | None,
        conn: Any = None,
        max_copies: int | None = None,
    ) -> InsertResult:
        """Insert messages in one transaction.

        With ``subscription`` the copies go to that subscription only (point-to-point),
        which is created in the same transaction when it does not exist yet;
        without it each message fans out to every subscription with a matching pattern and
        one that matches none is archived as ``unrouted``. Idempotency keys are reserved
        per topic for each message's ``dedupe_window`` seconds; a duplicate returns the
        original id and writes nothing, a conflicting one raises ``IdempotencyConflict``
        and writes nothing.
        With ``conn`` the caller's connection and transaction are used and never committed.
        More than ``max_copies`` copies in all raise ``LimitExceeded`` and write nothing.
        """

    async def message_insert_many_async(
        self,
        *,
        messages: Sequence[NewMessage],
        subscription: str | None,
        conn: Any = None,
        max_copies: int | None = None,
    ) -> InsertResult:
        """:meth:`message_insert_many` for coroutines: on a connection of the running
        loop's pool, or with ``conn`` the caller's async connection (psycopg's
        ``AsyncConnection``, SQLAlchemy's asyncio); SQLite runs it on the backend's own
        threads and refuses a ``conn`` (it has no async driver)."""

    def message_claim_many(
        self,
        *,
        subscription: str,
        limit: int,
        lease: float,
        worker: str | None,
        max_attempts: int | None = None,
    ) -> list[Delivery]:
        """Lease up to ``limit`` available copies, most urgent first; count the attempt.

        ``max_attempts`` (a consumer's retry policy) replaces a copy's own limit, so that the
        reaper's quarantine of crashing messages follows the same limit as retries."""

    def message_complete_many(
        self,
        *,
        leases: Sequence[Lease],
        values: Sequence[bytes | None] | None = None,
    ) -> list[int]:
        """Archive the copies as completed; return the ids whose lease was still valid
        (inside a caller's transaction: ``begin(conn).message_complete_many``).

        ``values`` (aligned with ``leases``) are the handlers' encoded return values, stored
        as results in the same statement; ``None`` (all of them, or the whole argument)
        stores nothing and costs nothing: the statement is the one without results."""

    async def close_async(self) -> None:
        """Let go of what :meth:`transaction_async` holds for the running event loop."""

    def message_retry_many(self, *, retries: Sequence[RetryRequest]) -> list[int]:
        """Return leased copies to the queue after a delay; return ids whose lease was valid."""

    def message_dead_many(self, *, deaths: Sequence[DeadRequest]) -> list[int]:
        """Move leased copies to the dead letters; return ids whose lease was valid."""

    def message_extend_leases(
        self, *, leases: Sequence[Lease], lease: float
    ) -> dict[int, datetime]:
        """Push the lease expiry to now + ``lease``; return the new expiry per valid id."""

    def message_release_many(self, *, leases: Sequence[Lease]) -> list[int]:
        """Give claimed-but-unstarted copies back at once, without counting the attempt."""

    def message_cancel_many(self, *, message_ids: Sequence[str]) -> int:
        """Archive not-running copies of the messages as cancelled and flag running ones
        for their workers; return how many copies were cancelled or flagged."""

    def message_cancel_requested(self, *, ids: Sequence[int]) -> list[int]:
        """Which of these running copies have a cancel request."""

    def message_cancel_leased(self, *, leases: Sequence[Lease]) -> list[int]:
        """Archive leased copies as cancelled; return the ids whose lease was valid."""

    def subscription_pause(self, *, name: str, paused: bool, actor: str, note: str | None) -> None:
        """Pause or resume a subscription, audited; ``NotFound`` for an unknown name."""

    def message_list(
        self, *, subscription: str | None, state: State | None, limit: int
    ) -> list[PendingMessage]: ...

    # --- maintenance (the reaper) ----------------------------------------------------------
    def lease_release_expired(self, *, limit: int) -> ReapResult:
        """Return copies whose lease expired to the queue, or to the dead letters when their
        attempts are spent (reason ``worker lost``)."""

    def message_expire(self, *, limit: int) -> int:
        """Archive copies whose TTL passed, as expired; return how many."""

    def key_repair(self, *, limit: int) -> int:
        """Promote the oldest blocked copy of every ordering key left without a head;
        return how many. A safety net: removals promote the next copy themselves."""

    def dedupe_trim(self, *, limit: int) -> int:
        """Delete idempotency keys whose window has passed; return how many."""

    # --- retention (per subscription; docs/reliability.md, "Retention") --------------------
    def retention_set(
        self,
        *,
        name: str,
        archive: float | None,
        dead: float | None,
        change_archive: bool,
        change_dead: bool,
    ) -> bool:
        """Set a subscription's own archive and dead-letter retention (seconds; ``None``: the
        broker's default), each only when its ``change_`` flag is set. False: no such
        subscription."""

    def retention_list(self, *, name: str | None) -> list[tuple[str, float | None, float | None]]:
        """``(subscription, archive, dead)`` retentions of its own (``None``: the default)."""

    def retention_bounds(self) -> RetentionBounds:
        """The longest and shortest retentions subscriptions have of their own."""

    def archive_partitions_maintain(self, *, ahead: int, keep: float) -> tuple[int, int]:
        """Create the archive's days up to ``ahead`` days from now and drop the days whose
        rows are all older than ``keep`` seconds; ``(created, dropped)``. PostgreSQL only
        (SQLite: ``(0, 0)``); leaderless, one caller at a time does the work."""

    def archive_trim(self, *, keep: float, limit: int) -> int:
        """Delete at most ``limit`` archive rows older than ``keep`` seconds, whatever their
        subscription (PostgreSQL: older than that time's day; later rows go with their
        day); return how many."""

    def archive_trim_shorter(self, *, keep: float, longest: float, limit: int) -> int:
        """Delete at most ``limit`` archive rows past their subscription's own retention
        (``keep``, the default, for those without one and for unrouted rows) where it is
        shorter than ``longest``; return how many."""

    def dead_trim(self, *, keep: float, limit: int) -> int:
        """Delete at most ``limit`` dead letters older than ``keep`` seconds."""

    def dead_trim_shorter(self, *, keep: float, longest: float, limit: int) -> int:
        """Delete at most ``limit`` dead letters past their subscription's own retention
        (``keep`` for those without one) where it is shorter than ``longest``."""

    # --- stored results (see features/results.py) ------------------------------------------
    def result_lookup(self, *, message_id: str) -> list[ResultRecord]:
        """Every trace of the message's copies: pending ones, stored values, dead letters
        and archive rows (``core.results.read_result`` picks each copy's result)."""

    def result_trim(self, *, ttl: float, limit: int) -> int:
        """Delete up to ``limit`` stored values older than ``ttl`` seconds (database clock)."""

    def result_watch(self, *, message_id: str) -> AbstractContextManager[ResultWatch]:
        """Hints that copies of ``message_id`` may have finished, from one source per
        backend shared by every waiter (``storage/result_hub.py``). PostgreSQL: LISTEN on
        the result channel (a value stored for this message) and the dead-letter channel;
        SQLite: the ``PRAGMA data_version`` watcher (any commit). When the block is entered
        the source listens (or gave up for now: the caller's fallback look covers it)."""

    def result_watch_async(
        self, *, message_id: str
    ) -> AbstractAsyncContextManager[AsyncResultWatch]:
        """:meth:`result_watch` on the running event loop."""

    # --- results by key (Celery's result backend; operations/task_results.py) -------------
    # A key's waiters watch ``result_watch(message_id=key)``: storing its value hints them.
    def task_result_get_many(self, *, keys: list[str]) -> dict[str, bytes]:
        """The stored, unexpired values of ``keys``."""

    def task_result_set(self, *, key: str, value: bytes, ttl: float) -> None:
        """Store ``value`` under ``key``, kept ``ttl`` seconds."""

    def task_result_incr(self, *, key: str, ttl: float) -> int:
        """Add one to the counter ``key``; return its new value."""

    def task_result_expire(self, *, key: str, ttl: float) -> bool:
        """Keep ``key`` ``ttl`` seconds from now."""

    def task_result_delete(self, *, keys: list[str]) -> int:
        """Delete ``keys``; return how many existed."""

    def task_result_trim(self, *, limit: int) -> int:
        """Delete up to ``limit`` expired rows."""

    # --- dead letters ----------------------------------------------------------------------
    def dead_list(
        self, *, where: DeadFilter, limit: int, after_id: int | None
    ) -> list[DeadLetter]: ...

    def dead_get(self, *, id: int) -> DeadLetter | None: ...

    def dead_replay(self, *, where: DeadFilter, actor: str, note: str | None) -> list[int]:
        """Put matching dead letters back in their subscription with attempts reset and the
        replay counted; record who did it. Return the new delivery ids."""

    def dead_purge(self, *, where: DeadFilter, actor: str, note: str | None) -> int: ...

    # --- archive and stats -----------------------------------------------------------------
    def archive_list(
        self,
        *,
        subscription: str | None,
        outcome: Outcome | None,
        message_id: str | None,
        limit: int,
    ) -> list[ArchivedMessage]: ...

    # --- processed keys (consumer-side idempotency; see features/processed.py) --------------

    def processed_reserve(
        self, *, scope: str, key: str, token: str, lease: float, window: float
    ) -> str:
        """Reserve ``key`` for ``lease`` seconds under ``token``: ``"reserved"`` when it was
        free (never seen, expired, or its holder's lease ran out), ``"done"`` when it was
        confirmed within its window, ``"busy"`` while another holder's lease runs."""

    def processed_confirm(self, *, scope: str, key: str, token: str, window: float) -> bool:
        """Mark our reservation done, kept ``window`` seconds; False if it is no longer ours."""

    def processed_extend(self, *, scope: str, key: str, token: str, lease: float) -> bool:
        """Push our reservation's lease to now + ``lease``; False if it is no longer ours."""

    def processed_release(self, *, scope: str, key: str, token: str) -> bool:
        """Give up our reservation (the effect failed): the next attempt may take the key."""

    def processed_forget(self, *, scope: str, key: str) -> bool:
        """Delete the key whatever its state (an operator's undo)."""

    def processed_trim(self, *, limit: int) -> int:
        """Delete up to ``limit`` keys past their window; return how many."""

    # --- sagas (multi-step workflows; see features/sagas.py) --------------------------------

    def saga_insert(self, *, saga: NewSaga) -> bool:
        """Create a ``running`` saga at step 0 with its steps ``pending`` and its deadline
        ``timeout`` seconds away; False (and nothing written) when the id exists."""

    def saga_get(self, *, id: str, steps: bool = True, lock: bool = False) -> SagaInstance | None:
        """The saga (with its steps unless ``steps`` is false). ``lock`` inside a
        transaction (``begin``) holds the saga against other transitions until it ends."""

    def saga_update(
        self,
        *,
        id: str,
        version: int,
        status: str,
        step: int,
        error: str | None,
        message_id: str | None,
        restart_deadline: bool = False,
    ) -> bool:
        """Compare-and-set: when the saga is still at ``version``, set its fields and bump
        the version (``restart_deadline``: the deadline becomes now + its timeout; a
        terminal status clears it and stamps ``finished_at``). False if it moved on."""

    def saga_step_update(
        self,
        *,
        saga_id: str,
        index: int,
        status: str,
        attempts: int = 0,
        output: str | None = None,
        error: str | None = None,
    ) -> bool:
        """Set a step's status (stamping the time that status stands for), raise its
        attempts to at least ``attempts``, and set ``output`` (JSON text) and ``error`` when
        given."""

    def saga_list(self, *, name: str | None, status: str | None, limit: int) -> list[SagaInstance]:
        """Sagas, newest first, without their steps."""

    def saga_due(self, *, limit: int) -> list[DueSaga]:
        """Non-terminal sagas whose deadline passed or whose awaited message is dead."""

    def saga_counts(self) -> dict[str, int]:
        """How many sagas there are in each status."""

    def stats_collect(self) -> list[SubscriptionStats]: ...

    def table_counts(self) -> dict[str, int]:
        """Row count of every sqlbroker table (for tests, health checks and the CLI)."""

    # --- observability: heartbeats, metrics and the audit trail ------------------------------
    def worker_beat(
        self,
        *,
        beat: WorkerBeat,
        minutes: Sequence[MinuteCounts],
        totals: Mapping[tuple[str, str], int],
    ) -> datetime:
        """In one transaction: record the worker as seen now (and stopped, with
        ``beat.stopping``), write its per-minute counters (absolute values: a row is owned by
        one worker, so writing it again is harmless) and add ``totals``, deltas keyed by
        ``(subscription, outcome)``, to the lifetime counters. Return the storage clock's now."""

    def worker_list(self) -> list[WorkerInfo]:
        """Every worker row, most recently seen first."""

    def metric_minutes(self, *, since: datetime) -> list[MinuteCounts]:
        """Per-minute counters of every worker for minutes starting at or after ``since``."""

    def metric_totals(self) -> dict[tuple[str, str], int]:
        """Lifetime outcome counters keyed by ``(subscription, outcome)``."""

    def archive_rare_counts(self, *, since: datetime) -> list[RareCount]:
        """Expired and unrouted copies still in the archive: in all and since ``since``."""

    def metric_trim(self, *, older_than: datetime, limit: int) -> int:
        """Delete minute counters and worker rows last seen before ``older_than``."""

    def audit_list(self, *, limit: int, before_id: int | None) -> list[AuditEntry]:
        """Audit entries, newest first; page with ``before_id``."""

    # --- schedules -------------------------------------------------------------------------
    def schedule_upsert(self, *, definition: ScheduleDefinition) -> ScheduleRecord:
        """Create the schedule, or redefine the one of that name. An identical definition
        changes nothing; one with the same timing keeps its next run and anchor; any other
        takes ``next_run_at`` and ``anchor_at`` from ``definition``. Pausing survives."""

    def schedule_list(self, *, names: Sequence[str] | None) -> list[ScheduleRecord]:
        """The named schedules (all with ``None``), by name."""

    def schedule_delete(self, *, name: str) -> bool: ...

    def schedule_set_paused(self, *, name: str, paused: bool, next_run_at: datetime | None) -> bool:
        """Pause, or resume with ``next_run_at`` (a paused schedule only: resuming a
        running one changes nothing). Returns whether the schedule exists."""

    def schedule_due(self, *, limit: int) -> DueSchedules:
        """Up to ``limit`` schedules, not paused, whose next run is at or before the
        storage clock's now, earliest first; and the earliest next run of the others."""

    def schedule_fire_many(self, *, fires: Sequence[ScheduleFire]) -> dict[str, list[str]]:
        """In one transaction: for each fire, advance its schedule by compare-and-set on
        (next run, definition, not paused) and, only when that succeeded, publish its
        messages as :meth:`message_insert_many` would. Returns the published message ids
        of each schedule that advanced; a fire that lost the race is left out."""

    # --- security: least-privilege roles and tenants (PostgreSQL; docs/security.md) ----------
    # SQLite has no roles and no row-level security: every one of these raises
    # ``ConfigurationError`` there. Names arrive validated (features/security.py).

    def roles_grant(self, *, prefix: str, create: bool) -> dict[str, dict[str, str]]:
        """Give the group roles ``<prefix>_<group>`` (``ROLE_GROUPS``) exactly their
        privileges on this schema's tables, revoking anything else they held there; with
        ``create``, create missing groups (NOLOGIN) first, else a missing one is a
        ``ConfigurationError``. Idempotent; run it after every migration. Returns
        :meth:`roles_show`."""

    def roles_show(self, *, prefix: str) -> dict[str, dict[str, str]]:
        """Role → table → privileges (``"DELETE, INSERT, SELECT"``) the groups hold."""

    def tenant_enable(self, *, enabled: bool) -> None:
        """Turn row-level security for tenants on or off (the schema owner's DDL)."""

    def tenant_enabled(self) -> bool: ...

    def tenant_set(self, *, role: str, tenant: str) -> None:
        """Map the login role ``role`` (it must exist) to ``tenant``; replaces a mapping."""

    def tenant_remove(self, *, role: str) -> bool: ...

    def tenant_list(self) -> list[TenantRole]:
        """The mappings the caller may see (the owner: all; a tenant role: its own)."""

    def tenant_assign(self, *, subscription: str, tenant: str | None) -> bool:
        """Hand an existing subscription to ``tenant`` (``None``: to no tenant)."""
