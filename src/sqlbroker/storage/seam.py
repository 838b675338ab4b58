"""The storage seam: every queue operation is a method of an executor.

:class:`Executor` (blocking) and :class:`AsyncExecutor` (coroutines) carry the same
operations, each written once as a plan (:mod:`sqlbroker.storage.plan`) in
:mod:`sqlbroker.storage.operations`; they differ only in how a plan runs:

- a backend runs each operation on a connection of its own, as one transaction (reads in
  none);
- a :class:`Tx` (``backend.begin(conn=None)``) runs every operation inside one transaction:
  the backend's own, or the caller's connection joined as a savepoint, never committed by us;
- an :class:`AsyncTx` (``backend.begin_async(conn=None)``) is the same for coroutines.

So any operation can join the caller's transaction, and nothing threads ``conn=`` through
the stack: a framework connection is adapted into a ``Tx`` once, where ``begin`` is called.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Concatenate, Generic, ParamSpec, TypeVar, overload

from sqlbroker.core.clock import Clock, DatabaseClock
from sqlbroker.core.limits import Limits
from sqlbroker.storage.operations import (
    admin,
    control,
    flow,
    messages,
    observability,
    processed,
    publishing,
    results,
    retention,
    sagas,
    schedules,
    schema,
    security,
    subscriptions,
    task_results,
)
from sqlbroker.storage.operations.subscriptions import KnownQueues
from sqlbroker.storage.plan import Access, Plan, access_of
from sqlbroker.storage.promotion import PromotionThrottle

P = ParamSpec("P")
T = TypeVar("T")
Run = Callable[[Plan[Any]], Any]


@dataclass(frozen=True, slots=True)
class Settings:
    """What an operation's plan may read besides its arguments: the backend's options."""

    dialect: str
    """``"sqlite"`` or ``"postgresql"``, for messages: no plan branches on it, a rule that
    differs between the dialects reads one of the capability flags below."""
    limits: Limits = field(default_factory=Limits)
    clock: Clock = field(default_factory=DatabaseClock)
    """Every statement's ``now`` comes from it (``None``: the database's own clock)."""
    promotion: PromotionThrottle = field(default_factory=PromotionThrottle)
    """When a claim first promotes its subscription's due delayed copies."""
    supports_notify: bool = False
    """Whether commits can wake listeners (PostgreSQL's NOTIFY on ``notify_channel``)."""
    notify_channel: str = ""
    dead_channel: str = ""
    """Where dead-lettering is announced (PostgreSQL's NOTIFY)."""
    cancel_channel: str = ""
    """Where cancels of running copies are announced (PostgreSQL's NOTIFY)."""
    claim_commit: str = "off"
    """PostgreSQL: the ``synchronous_commit`` of a claim's own transaction."""
    archive_completed: bool = True
    """Whether a completed copy is kept in the archive (else only deleted)."""
    result_channel: str = ""
    """Where a stored result is announced (PostgreSQL's NOTIFY)."""
    partitioned_archive: bool = False
    """PostgreSQL: the archive is range-partitioned by day (retention drops whole days)."""
    key_locks: bool = False
    """Whether writers of one ordering key must lock it (PostgreSQL's advisory locks);
    SQLite's writers are serialized by ``BEGIN IMMEDIATE`` already."""
    schema: str | None = None
    """PostgreSQL: the schema of the tables (``None``: the search path's)."""
    array_params: bool = False
    """Whether the driver binds whole arrays (PostgreSQL): a batch is then one statement;
    else (SQLite, in-process) one statement per row (operations/publishing.py)."""
    inserts_create_queue: bool = False
    """Whether an insert into a queue creates the queue itself (PostgreSQL's statements do);
    else a known queue's insert checks it is still there or creates it first
    (operations/publishing.py)."""
    writes_in_with: bool = False
    """Whether a statement's ``WITH`` may change data (PostgreSQL): a settle of mixed kinds
    is then one statement, a complete deletes what it archives in the same one; SQLite
    settles kind by kind and deletes completed copies by a statement of its own."""
    one_writer: bool = False
    """Whether a write transaction holds the database's only write lock (SQLite): a claim
    then commits before it decodes its rows (``commit_point``), so that other writers do
    not wait for Python work."""
    roles: bool = False
    """Whether the database has roles and row-level security (PostgreSQL): least-privilege
    roles and tenant isolation need them."""
    known_queues: KnownQueues | None = None
    """The queues this process saw exist: on PostgreSQL a send to one is one statement;
    on SQLite a single send to one skips ``queue_create`` (its insert checks the queue is
    still there, operations/publishing.py)."""
    flow_limited: flow.FlowLimited = field(default_factory=flow.FlowLimited)
    """The subscriptions last found flow-limited (their claims skip the plain claim)."""


class Operation(Generic[P, T]):
    """A plan exposed as a method of every executor: blocking on an :class:`Executor`, a
    coroutine on an :class:`AsyncExecutor` (whose ``execute`` is one).

    A long-lived executor's method (``keeps_methods``) is made on its first use and kept in
    the executor's ``__dict__`` (this descriptor has no ``__set__``, so the kept one
    answers from then on): a call then costs no lookup here and no new function."""

    def __init__(self, plan: Callable[Concatenate[Settings, P], Plan[T]]) -> None:
        self.plan = plan
        self.access = access_of(plan)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, executor: None, owner: type) -> Operation[P, T]: ...
    @overload
    def __get__(self, executor: Executor, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, executor: AsyncExecutor, owner: type) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, executor: Operations | None, owner: type) -> Any:
        if executor is None:
            return self
        plan, access, execute = self.plan, self.access, executor.execute
        call: Callable[..., Any]
        # A database with one writer runs every write in one transaction: nothing for a
        # call's arguments to decide (Access.atomic_when).
        if access.atomic_when is None or executor.settings.one_writer:

            def call(*args: P.args, **kwargs: P.kwargs) -> Any:
                return execute(plan(executor.settings, *args, **kwargs), access)

        else:

            def call(*args: P.args, **kwargs: P.kwargs) -> Any:
                settings = executor.settings
                return execute(plan(settings, *args, **kwargs), access.of_call(settings, kwargs))

        if executor.keeps_methods:
            vars(executor)[self.name] = call
        return call


class Operations(ABC):
    """The queue operations, declared once for :class:`Executor` and
    :class:`AsyncExecutor`."""

    settings: Settings
    keeps_methods: ClassVar[bool] = True
    """Whether an operation's method is kept once made (see :class:`Operation`)."""

    @abstractmethod
    def execute(self, plan: Plan[Any], access: Access) -> Any:
        """Run one operation's plan, as ``access`` says (its result, or a coroutine)."""

    # --- leased copies and the reaper ---------------------------------------------------
    message_claim_many = Operation(messages.message_claim_many)
    message_settle_many = Operation(messages.message_settle_many)
    message_extend_leases = Operation(messages.message_extend_leases)
    message_release_many = Operation(messages.message_release_many)
    message_cancel_many = Operation(messages.message_cancel_many)
    lease_release_expired = Operation(messages.lease_release_expired)
    message_expire = Operation(messages.message_expire)
    key_repair = Operation(messages.key_repair)
    dedupe_trim = Operation(messages.dedupe_trim)

    # --- flow control by an operator: pause, cancel running copies ---------------------
    subscription_pause = Operation(control.subscription_pause)
    message_cancel_requested = Operation(control.message_cancel_requested)

    # --- flow limits: caps, rate limits, fairness (the claim obeys them) -------------------
    flow_set = Operation(flow.flow_set)
    flow_list = Operation(flow.flow_list)

    # --- processed keys (consumer-side idempotency; features/processed.py) ----------------
    processed_reserve = Operation(processed.reserve)
    processed_confirm = Operation(processed.confirm)
    processed_extend = Operation(processed.extend)
    processed_release = Operation(processed.release)
    processed_forget = Operation(processed.forget)
    processed_trim = Operation(processed.trim)

    # --- subscriptions -----------------------------------------------------------------
    subscription_upsert = Operation(subscriptions.subscription_upsert)
    subscription_list = Operation(subscriptions.subscription_list)

    # --- stored results (features/results.py) -----------------------------------------
    result_lookup = Operation(results.result_lookup)
    result_trim = Operation(results.result_trim)

    # --- results by key (Celery's result backend; contrib/celery/results.py) ------------
    task_result_get_many = Operation(task_results.task_result_get_many)
    task_result_set = Operation(task_results.task_result_set)
    task_result_incr = Operation(task_results.task_result_incr)
    task_result_expire = Operation(task_results.task_result_expire)
    task_result_delete = Operation(task_results.task_result_delete)
    task_result_trim = Operation(task_results.task_result_trim)

    # --- retention (features/retention.py) ----------------------------------------------
    retention_set = Operation(retention.retention_set)
    retention_list = Operation(retention.retention_list)
    retention_bounds = Operation(retention.retention_bounds)
    archive_partitions_maintain = Operation(retention.archive_partitions_maintain)
    archive_trim = Operation(retention.archive_trim)
    archive_trim_shorter = Operation(retention.archive_trim_shorter)
    dead_trim = Operation(retention.dead_trim)
    dead_trim_shorter = Operation(retention.dead_trim_shorter)

    # --- listings, dead-letter admin, archive, stats -------------------------------------
    message_list = Operation(admin.message_list)
    dead_list = Operation(admin.dead_list)
    dead_get = Operation(admin.dead_get)
    dead_replay = Operation(admin.dead_replay)
    dead_purge = Operation(admin.dead_purge)
    archive_list = Operation(admin.archive_list)
    stats_collect = Operation(admin.stats_collect)
    # --- sagas (multi-step workflows; features/sagas.py) ---------------------------------
    saga_insert = Operation(sagas.insert)
    saga_get = Operation(sagas.get)
    saga_update = Operation(sagas.update)
    saga_step_update = Operation(sagas.step_update)
    saga_list = Operation(sagas.list_)
    saga_due = Operation(sagas.due)
    saga_counts = Operation(sagas.counts)
    # --- end sagas ---------------------------------------------------------------------------

    # --- schedules (features/schedules.py) -------------------------------------------------
    schedule_upsert = Operation(schedules.upsert)
    schedule_list = Operation(schedules.list_)
    schedule_delete = Operation(schedules.delete)
    schedule_set_paused = Operation(schedules.set_paused)
    schedule_due = Operation(schedules.due)
    schedule_fire_many = Operation(schedules.fire_many)
    # --- end schedules -----------------------------------------------------------------------

    # --- security: roles and tenants (PostgreSQL; features/security.py) -----------------
    roles_grant = Operation(security.roles_grant)
    roles_show = Operation(security.roles_show)
    roles_tables = Operation(security.roles_tables)
    tenant_enable = Operation(security.tenant_enable)
    tenant_enabled = Operation(security.tenant_enabled)
    tenant_set = Operation(security.tenant_set)
    tenant_remove = Operation(security.tenant_remove)
    tenant_list = Operation(security.tenant_list)
    tenant_assign = Operation(security.tenant_assign)
    # --- end security ------------------------------------------------------------------------

    # --- observability: heartbeats, metrics, audit (runtime/heartbeat.py, core/observability.py)
    worker_beat = Operation(observability.worker_beat)
    worker_list = Operation(observability.worker_list)
    metric_minutes = Operation(observability.metric_minutes)
    metric_totals = Operation(observability.metric_totals)
    archive_rare_counts = Operation(observability.archive_rare_counts)
    metric_trim = Operation(observability.metric_trim)
    audit_list = Operation(observability.audit_list)
    clock_now = Operation(observability.clock_now)
    # --- end observability -------------------------------------------------------------------

    # --- schema (the migrations: Backend.migrate; storage/schema.py) ---------------------
    schema_version = Operation(schema.schema_version)
    # --- end schema --------------------------------------------------------------------------

    # --- publishing (operations/publishing.py; queues: operations/subscriptions.py) ---------
    message_insert_many = Operation(publishing.message_insert_many)
    subscription_ensure = Operation(subscriptions.subscription_ensure)
    subscription_delete = Operation(subscriptions.subscription_delete)
    # --- end publishing ----------------------------------------------------------------------


class Executor(Operations):
    """The queue operations, blocking. Subclasses say how a plan runs."""

    @abstractmethod
    def execute(self, plan: Plan[T], access: Access) -> T:
        """Run one operation's plan to its result, as ``access`` says."""


class AsyncExecutor(Operations):
    """The queue operations as coroutines. Subclasses say how a plan runs."""

    @abstractmethod
    async def execute(self, plan: Plan[T], access: Access) -> T:
        """Run one operation's plan to its result, as ``access`` says."""


class Tx(Executor):
    """The operations inside one transaction (see ``Backend.begin``).

    ``connection`` is the driver connection it runs on, for the caller's own statements in
    the same transaction (a handler's effects, an outbox's writes)."""

    keeps_methods = False  # it lives for one block: a kept method would hold it in a cycle

    def __init__(self, settings: Settings, run: Run, connection: Any) -> None:
        self.settings = settings
        self._run = run
        self.connection = connection

    def execute(self, plan: Plan[T], access: Access) -> T:
        result: T = self._run(plan)
        return result


class AsyncTx(AsyncExecutor):
    """The operations inside one transaction, for coroutines (see ``Backend.begin_async``);
    ``connection`` as for :class:`Tx`."""

    keeps_methods = False  # as for Tx

    def __init__(
        self, settings: Settings, run: Callable[[Plan[Any]], Awaitable[Any]], connection: Any
    ) -> None:
        self.settings = settings
        self._run = run
        self.connection = connection

    async def execute(self, plan: Plan[T], access: Access) -> T:
        result: T = await self._run(plan)
        return result
