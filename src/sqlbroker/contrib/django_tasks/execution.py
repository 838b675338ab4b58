"""Running Django tasks in a sqlbroker worker: the handler of a task queue, and the broker
that ``manage.py sqlbroker_worker`` runs."""

from __future__ import annotations

import contextlib
import json
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from sqlbroker.app import Broker
from sqlbroker.client.consuming import worker_name
from sqlbroker.contrib.django import database_alias, new_broker
from sqlbroker.contrib.django_tasks.backend import SqlbrokerBackend
from sqlbroker.contrib.django_tasks.framework import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    set_field,
    signals,
    task_backends,
)
from sqlbroker.core.errors import ConfigurationError
from sqlbroker.core.policies import Reject
from sqlbroker.runtime.message import Message

TRIM_INTERVAL = 3600.0


def backend_named(alias: str) -> SqlbrokerBackend:
    """The task backend ``alias``, which must be a :class:`SqlbrokerBackend`."""
    from django.conf import settings

    if alias not in (getattr(settings, "TASKS", None) or {}):
        raise ConfigurationError(f"settings.TASKS has no backend named {alias!r}")
    backend = task_backends[alias]
    if not isinstance(backend, SqlbrokerBackend):
        raise ConfigurationError(
            f"TASKS[{alias!r}] is {type(backend).__module__}.{type(backend).__qualname__},"
            " not sqlbroker.contrib.django_tasks.SqlbrokerBackend"
        )
    return backend


def stored_value(value: Any) -> Any:
    """What is kept of a task's return value: normalised by Django's own rule (tuples
    become lists, bytes text; anything else that is not JSON raises ``TypeError`` or
    ``ValueError``, as in Django's backends) and read back as JSON would read it, so dict
    keys are text — what a task returns is what ``get_result`` shows, in any process."""
    normalized = normalize_json(value)
    if normalized is None or type(normalized) in (str, int, bool):
        return normalized
    return json.loads(json.dumps(normalized, allow_nan=False))


def task_handler(backend: SqlbrokerBackend) -> Callable[[Message], None]:
    """The sqlbroker handler (of a subscriber with ``ack="manual"``) that runs one task
    message, stores its return value with the acknowledgement and sends Django's
    ``task_started`` and ``task_finished`` signals around it."""
    worker_id = worker_name()

    def failed(result: TaskResult, error: BaseException) -> None:
        set_field(result, "status", TaskResultStatus.FAILED)
        set_field(result, "finished_at", timezone.now())
        kind = type(error)
        result.errors.append(
            TaskError(
                exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                traceback="".join(traceback.format_exception(error)),
            )
        )
        signals.task_finished.send(type(backend), task_result=result)

    def run_task(msg: Message) -> None:
        payload = msg.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
            raise Reject("not a Django task message")
        try:
            task = import_string(payload["task"])
        except ImportError as error:
            raise Reject(f"task {payload['task']!r} cannot be imported: {error}") from error
        if not isinstance(task, Task):
            raise Reject(f"{payload['task']!r} is not a task")
        started = timezone.now()
        result = TaskResult(
            task=task,
            id=msg.id,
            status=TaskResultStatus.RUNNING,
            enqueued_at=msg.enqueued_at,
            started_at=started,
            finished_at=None,
            last_attempted_at=started,
            args=payload.get("args") or [],
            kwargs=payload.get("kwargs") or {},
            backend=backend.alias,
            errors=[],
            worker_ids=[worker_id] * msg.attempt,
        )
        close_old_connections()
        try:
            signals.task_started.send(type(backend), task_result=result)
            try:
                if task.takes_context:
                    value = task.call(
                        TaskContext(task_result=result), *result.args, **result.kwargs
                    )
                else:
                    value = task.call(*result.args, **result.kwargs)
            except Exception as error:
                if msg.attempt > backend.retries:  # the retry policy dead-letters it now
                    failed(result, error)
                raise
            try:
                value = stored_value(value)
                msg.ack(result=value)  # InvalidPayload (a ValueError) over the size limit
            except (TypeError, ValueError) as error:
                # Django fails a task whose return value it cannot keep. Running it again
                # would return the same: dead-lettered now, whatever RETRIES says.
                msg.reject(f"the task's return value cannot be stored: {error}", error=error)
                failed(result, error)
                return
            set_field(result, "_return_value", value)
            set_field(result, "status", TaskResultStatus.SUCCESSFUL)
            set_field(result, "finished_at", timezone.now())
            signals.task_finished.send(type(backend), task_result=result)
        finally:
            close_old_connections()

    return run_task


def worker_broker(
    backend: SqlbrokerBackend,
    queue_names: Sequence[str],
    *,
    concurrency: int,
    timeout: float | None,
) -> Broker:
    """A broker of its own with one subscriber per task queue."""
    if not queue_names:
        raise ConfigurationError(
            f"TASKS[{backend.alias!r}] names no QUEUES: give the queues to run (--queue)"
        )
    for name in queue_names:
        if backend.queues and name not in backend.queues:
            raise ConfigurationError(
                f"queue {name!r} is not in TASKS[{backend.alias!r}]['QUEUES']"
                f" ({', '.join(sorted(backend.queues))})"
            )
    broker = new_broker()
    handler = task_handler(backend)
    for name in queue_names:
        broker.subscriber(
            queue=backend.sqlbroker_queue(name),
            concurrency=concurrency,
            timeout=timeout,
            retry=backend.retry_policy(),
            ack="manual",
        )(handler)
    return broker


def trim_records(backend: SqlbrokerBackend) -> int:
    """Delete the calls of tasks due longer ago than ``RETENTION``; return how many."""
    from sqlbroker.contrib.django_tasks.models import TaskRecord

    deleted, _ = (
        TaskRecord.objects.using(database_alias())
        .filter(backend=backend.alias, keep_until__lt=timezone.now())
        .delete()
    )
    return int(deleted)


@contextlib.contextmanager
def trimming(backend: SqlbrokerBackend) -> Iterator[None]:
    """Runs :func:`trim_records` now and every :data:`TRIM_INTERVAL` seconds in a thread of
    its own while the block runs."""
    stopped = threading.Event()

    def loop() -> None:
        while not stopped.is_set():
            try:
                trim_records(backend)
            except Exception:  # a failed trim is retried next round; tasks go on
                import logging

                logging.getLogger(__name__).exception("trimming task records failed")
            finally:
                close_old_connections()
            stopped.wait(TRIM_INTERVAL)

    thread = threading.Thread(target=loop, name="sqlbroker-task-trim", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join(timeout=10)
