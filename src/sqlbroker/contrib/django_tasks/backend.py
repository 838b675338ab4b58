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
  message waits, RUNNING while leased, SUCCESSFUL once completed (``return_value`` is
  what the task returned, kept as a stored result, docs/results.md), FAILED once
  dead-lettered (with the error and traceback) or expired. Once the result is older than
  the broker's ``result_ttl`` it raises ``TaskResultDoesNotExist``.

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
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
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
from sqlbroker.core.errors import ConfigurationError, NotFound, SqlbrokerError
from sqlbroker.core.message import ArchivedMessage, DeadLetter, State
from sqlbroker.core.policies import RetryPolicy
from sqlbroker.core.results import Result
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
        result = _ready(task, "", now, list(args), dict(kwargs), self.alias)
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
        result = _ready(
            task, message_id, record.enqueued_at, record.args, record.kwargs, record.backend
        )
        try:
            locate(result, self.sqlbroker_queue(record.queue_name))
        except NotFound as gone:
            raise TaskResultDoesNotExist(
                f"task {message_id} finished and its result is no longer kept: {gone}"
            ) from None
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


def locate(result: TaskResult, queue: str) -> None:
    """Set ``result``'s state from where its message is now, by ``broker.result`` (its
    stored result, or that it is not finished) and, for the details, the queue's running
    copies, the archive by message id or the dead letters around the moment it died.
    Raises ``NotFound`` once nothing of a finished task is kept (its result is older than
    ``result_ttl``)."""
    broker = get_broker()
    done = broker.result(result.id, subscription=queue)
    if done is None:
        for copy in broker.pending(queue, state=State.RUNNING, limit=validate.MAX_BATCH):
            if copy.message_id == result.id:
                set_field(result, "status", TaskResultStatus.RUNNING)
                set_field(result, "worker_ids", [WORKER_ID] * copy.attempts)
                return
        # Not running: waiting (perhaps for a retry) — or it finished since the first look.
        done = broker.result(result.id, subscription=queue)
        if done is None:
            return
    _finish(result, done, _trace(queue, done))


def _trace(queue: str, done: Result) -> ArchivedMessage | DeadLetter | None:
    broker = get_broker()
    if done.outcome != "dead":
        for archived in broker.archive(queue, message_id=done.message_id, limit=1):
            return archived
        return None
    # Dead letters are not looked up by message id: read those of the queue that died
    # within a second of this one (a page or two, however many there are).
    after_id: int | None = None
    while True:
        page = broker.dead_letters.list(
            subscription=queue,
            dead_after=done.finished_at - _NEAR,
            dead_before=done.finished_at + _NEAR,
            limit=500,
            after_id=after_id,
        )
        for dead in page:
            if dead.message_id == done.message_id:
                return dead
        if len(page) < 500:
            return None
        after_id = page[-1].id


_NEAR = timedelta(seconds=1)


def _ready(
    task: Task, result_id: str, enqueued_at: datetime, args: Any, kwargs: Any, backend: str
) -> TaskResult:
    """A result not started yet (:func:`locate` then sets where the task is)."""
    return TaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus.READY,
        enqueued_at=enqueued_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
    )


def _finish(result: TaskResult, done: Result, trace: ArchivedMessage | DeadLetter | None) -> None:
    set_field(result, "finished_at", done.finished_at)
    # A task that finished ran at least once; the archive or dead letter says how often.
    set_field(result, "worker_ids", [WORKER_ID] * (trace.attempts if trace else 1))
    if trace is not None:
        set_field(result, "started_at", trace.first_started_at)
        set_field(result, "last_attempted_at", trace.first_started_at)
    if done.outcome == "completed":
        set_field(result, "status", TaskResultStatus.SUCCESSFUL)
        set_field(result, "_return_value", done.value)
        return
    set_field(result, "status", TaskResultStatus.FAILED)  # dead, expired or cancelled
    if isinstance(trace, DeadLetter):
        set_field(result, "last_attempted_at", trace.last_failed_at)
        error_type, text = trace.error_type, trace.traceback or trace.error_message
    elif done.error is not None:
        error_type, text = done.error.type, done.error.traceback or done.error.message
    else:
        return
    error = TaskError(
        exception_class_path=_class_path(error_type), traceback=text or done.reason or ""
    )
    set_field(result, "errors", [error])


def _class_path(error_type: str | None) -> str:
    """An importable path for ``TaskError.exception_class`` (sqlbroker stores builtins
    by their bare name; a worker that vanished has no exception at all)."""
    if not error_type or error_type == "sqlbroker.DeadLetter":  # dead without an exception
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
