"""``SqlbrokerBackend``: Django Tasks on sqlbroker, in the database Django already uses.

.. code-block:: python

    INSTALLED_APPS = [..., "sqlbroker.contrib.django_tasks"]
    TASKS = {
        "default": {
            "BACKEND": "sqlbroker.contrib.django_tasks.SqlbrokerBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"RETRIES": 0},          # all optional, see OPTIONS below
        }
    }

- ``enqueue`` sends one message to the sqlbroker queue ``<QUEUE_PREFIX><queue_name>`` through
  Django's own connection, so it joins the caller's transaction: a task enqueued inside
  ``transaction.atomic()`` (or a request under ``ATOMIC_REQUESTS``) reaches the workers when
  that transaction commits and never if it rolls back — ``on_commit`` semantics without the
  window in which a crash after the commit loses the task.
- ``python manage.py sqlbroker_worker`` runs the tasks (a sqlbroker worker).
- ``get_result(id)`` reads the task's state from sqlbroker each time: READY while its
  message waits, RUNNING while leased, SUCCESSFUL once archived as completed, FAILED once
  dead-lettered (with the error and traceback) or expired. Return values are not stored.

OPTIONS (each optional):

- ``QUEUE_PREFIX`` (``"tasks."``): prepended to a Django queue name to give the sqlbroker queue;
- ``RETRIES`` (``0``): how many times a task that raised is tried again, with exponential
  backoff, before it is FAILED. A task whose worker died is delivered again whatever this
  says (up to the broker's ``max_attempts``): crashes are sqlbroker's to recover from;
- ``RETENTION`` (``7 days``, seconds): how long after it was due the call of a task
  (path and arguments) is kept for ``get_result``.

The broker (URL, ``Broker`` options) comes from ``settings.SQLBROKER``
(:mod:`sqlbroker.contrib.django`); it must be the database Django writes the task to.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections, transaction
from django.utils import timezone

from sqlbroker.contrib.django import database_alias, get_broker
from sqlbroker.contrib.django_tasks.framework import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    set_field,
    signals,
)
from sqlbroker.core import validate
from sqlbroker.core.errors import ConfigurationError, SqlbrokerError
from sqlbroker.core.message import ArchivedMessage, DeadLetter, Outcome, PendingMessage, State
from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.topics import validate_topic

DEFAULT_PREFIX = "tasks."
DEFAULT_RETENTION = 7 * 24 * 3600.0
OPTION_NAMES = frozenset({"QUEUE_PREFIX", "RETRIES", "RETENTION"})
WORKER_ID = "sqlbroker"
"""What ``TaskResult.worker_ids`` holds per attempt: sqlbroker does not keep which worker
ran each attempt, only how many there were (``TaskResult.attempts`` counts them)."""

# Django's priority runs from -100 to 100, higher first; sqlbroker's from 0 to 9, lower
# first. The bands keep the order and keep small priorities (the common -10..10) apart.
_BANDS = ((50, 0), (10, 1), (2, 2), (1, 3), (0, 4), (-1, 5), (-9, 6), (-49, 7))


def sqlbroker_priority(priority: int) -> int:
    """The sqlbroker priority (0 most urgent) of a Django task priority (100 most urgent):
    ≥ 50 → 0, 10…49 → 1, 2…9 → 2, 1 → 3, 0 → 4, −1 → 5, −9…−2 → 6, −49…−10 → 7,
    ≤ −50 → 8. Tasks in one band run in the order they became due."""
    for lowest, band in _BANDS:
        if priority >= lowest:
            return band
    return 8


class SqlbrokerBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django Tasks backend on sqlbroker (see the module's documentation)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"TASKS[{alias!r}]['OPTIONS'] must be a dict")
        unknown = sorted(set(options) - OPTION_NAMES)
        if unknown:
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown};"
                f" known: {sorted(OPTION_NAMES)}"
            )
        try:
            self.queue_prefix = str(options.get("QUEUE_PREFIX", DEFAULT_PREFIX))
            self.retries = validate.integer(
                options.get("RETRIES", 0), "RETRIES", minimum=0, maximum=validate.MAX_ATTEMPTS - 1
            )
            self.retention = validate.seconds(
                options.get("RETENTION", DEFAULT_RETENTION), "RETENTION", allow_zero=False
            )
            for queue_name in sorted(self.queues):
                self.sqlbroker_queue(queue_name)
        except SqlbrokerError as error:
            raise ConfigurationError(f"TASKS[{alias!r}]: {error}") from error

    # --- names and policies ------------------------------------------------------------------

    def sqlbroker_queue(self, queue_name: str) -> str:
        """The sqlbroker queue of a Django queue name (``tasks.default``)."""
        if not isinstance(queue_name, str):
            raise ConfigurationError(f"queue names are text, not {type(queue_name).__name__}")
        return validate_topic(f"{self.queue_prefix}{queue_name}", "queue")

    def retry_policy(self) -> RetryPolicy:
        """How the worker settles a task that raised: FAILED at once by default (Django's
        own semantics), or retried ``RETRIES`` times with backoff first."""
        if self.retries == 0:
            return RetryPolicy(retry_on=())
        return RetryPolicy(max_attempts=self.retries + 1)

    # --- enqueue -----------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Send the task in the caller's transaction on the broker's Django database; the
        ``task_enqueued`` signal is sent once that transaction commits."""
        self.validate_task(task)
        queue = self.sqlbroker_queue(task.queue_name)
        alias = database_alias()
        now = timezone.now()
        result = TaskResult(
            task=task,
            id="",
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        run_after = _aware(task.run_after)
        payload = {"task": task.module_path, "args": result.args, "kwargs": result.kwargs}
        from sqlbroker.contrib.django_tasks.models import TaskRecord

        # Opened before the transaction: opening a broker on SQLite reads its schema on a
        # connection of its own, which must not wait for the write lock we are about to take.
        broker = get_broker()
        with transaction.atomic(using=alias):
            message_id = broker.send(
                queue,
                payload,
                priority=sqlbroker_priority(task.priority),
                at=run_after,
                headers={"django-task": task.module_path},
                conn=connections[alias],
            )
            TaskRecord.objects.using(alias).create(
                id=uuid.UUID(message_id),
                task_path=task.module_path,
                args=result.args,
                kwargs=result.kwargs,
                backend=self.alias,
                queue_name=task.queue_name,
                priority=task.priority,
                run_after=run_after,
                enqueued_at=now,
                keep_until=max(now, run_after or now) + timedelta(seconds=self.retention),
            )
        set_field(result, "id", message_id)
        transaction.on_commit(
            lambda: signals.task_enqueued.send(type(self), task_result=result), using=alias
        )
        return result

    # --- results -----------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task's state as sqlbroker has it now (see the module's documentation)."""
        from sqlbroker.contrib.django_tasks.models import TaskRecord

        try:
            message_id = str(uuid.UUID(str(result_id)))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        record = TaskRecord.objects.using(database_alias()).filter(id=message_id).first()
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        task = _task_of(record)
        result = TaskResult(
            task=task,
            id=message_id,
            status=TaskResultStatus.READY,
            enqueued_at=record.enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=record.args,
            kwargs=record.kwargs,
            backend=record.backend,
            errors=[],
            worker_ids=[],
        )
        _apply(
            result, locate(self.sqlbroker_queue(record.queue_name), message_id, record.enqueued_at)
        )
        return result

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        from django.apps import apps

        if not apps.is_installed("sqlbroker.contrib.django_tasks"):
            yield checks.Error(
                "SqlbrokerBackend needs 'sqlbroker.contrib.django_tasks' in INSTALLED_APPS"
                " (its table records each task's call for get_result)",
                id="sqlbroker.E001",
            )
        alias = database_alias()
        database = settings.DATABASES[alias]
        mode = (database.get("OPTIONS") or {}).get("transaction_mode")
        if database.get("ENGINE") == "django.db.backends.sqlite3" and mode != "IMMEDIATE":
            yield checks.Warning(
                f"DATABASES[{alias!r}] is SQLite without OPTIONS['transaction_mode'] ="
                " 'IMMEDIATE': a transaction that reads before it enqueues a task may fail"
                " with 'database is locked' while a worker writes",
                hint="set DATABASES[...]['OPTIONS'] = {'transaction_mode': 'IMMEDIATE'}",
                id="sqlbroker.W001",
            )


# --- where a task is ------------------------------------------------------------------------

Found = PendingMessage | ArchivedMessage | DeadLetter


class Waiting:
    """The task's message waits in its queue (available, scheduled or blocked)."""


def locate(queue: str, message_id: str, enqueued_at: datetime) -> Found | Waiting:
    """Where the task's message is now: archived, running, dead-lettered or waiting.

    A copy only moves forward (waiting → running → archive or dead letters, or back to
    waiting for a retry), so the archive is read (by message id) before and after the
    running copies: one that finishes meanwhile is found the second time. The queue's
    running copies and its dead letters since the task was enqueued are scanned (sqlbroker
    has no lookup of those by message id yet); the waiting ones, however many, never are:
    a task whose record exists and is found nowhere else is waiting."""
    broker = get_broker()
    for archived in broker.archive(queue, message_id=message_id, limit=1):
        return archived
    for copy in broker.pending(queue, state=State.RUNNING, limit=validate.MAX_BATCH):
        if copy.message_id == message_id:
            return copy
    for archived in broker.archive(queue, message_id=message_id, limit=1):
        return archived
    for dead in _dead_letters(queue, since=enqueued_at - timedelta(hours=1)):
        if dead.message_id == message_id:
            return dead
    return Waiting()


def _dead_letters(queue: str, *, since: datetime) -> Iterator[DeadLetter]:
    broker = get_broker()
    after_id: int | None = None
    while True:
        page = broker.dead_letters.list(
            subscription=queue, dead_after=since.astimezone(UTC), limit=500, after_id=after_id
        )
        yield from page
        if len(page) < 500:
            return
        after_id = page[-1].id


def _apply(result: TaskResult, state: Found | Waiting) -> None:
    if isinstance(state, Waiting):
        return
    if isinstance(state, PendingMessage):
        running = state.state == State.RUNNING
        set_field(result, "status", TaskResultStatus.RUNNING if running else TaskResultStatus.READY)
        set_field(result, "worker_ids", [WORKER_ID] * state.attempts)
        return
    set_field(result, "started_at", state.first_started_at)
    set_field(result, "last_attempted_at", state.first_started_at)
    set_field(result, "worker_ids", [WORKER_ID] * state.attempts)
    if isinstance(state, ArchivedMessage):
        set_field(result, "finished_at", state.finished_at)
        completed = state.outcome == Outcome.COMPLETED
        set_field(
            result, "status", TaskResultStatus.SUCCESSFUL if completed else TaskResultStatus.FAILED
        )
        return
    set_field(result, "finished_at", state.dead_at)
    set_field(result, "last_attempted_at", state.last_failed_at)
    set_field(result, "status", TaskResultStatus.FAILED)
    set_field(
        result,
        "errors",
        [
            TaskError(
                exception_class_path=_class_path(state.error_type),
                traceback=state.traceback or state.error_message or state.reason,
            )
        ],
    )


def _class_path(error_type: str | None) -> str:
    """An importable path for ``TaskError.exception_class`` (sqlbroker stores builtins
    by their bare name; a worker that vanished has no exception at all)."""
    if not error_type:
        return "sqlbroker.WorkerCrashed"
    return error_type if "." in error_type else f"builtins.{error_type}"


def _task_of(record: Any) -> Task:
    from django.utils.module_loading import import_string

    try:
        found = import_string(record.task_path)
    except ImportError as error:
        raise TaskResultDoesNotExist(
            f"task {record.task_path!r} of result {record.id} cannot be imported: {error}"
        ) from error
    if not isinstance(found, Task):
        raise TaskResultDoesNotExist(f"{record.task_path!r} is not a task")
    return found.using(
        priority=record.priority,
        queue_name=record.queue_name,
        run_after=record.run_after,
        backend=record.backend,
    )


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or timezone.is_aware(moment):
        return moment
    zone = timezone.get_current_timezone() if settings.USE_TZ else timezone.get_default_timezone()
    aware: datetime = timezone.make_aware(moment, zone)
    return aware
