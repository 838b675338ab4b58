"""The Tasks framework this backend plugs into: Django's own ``django.tasks`` (Django ≥ 6.0)
when it is there, else the ``django-tasks`` backport (Django 4.2–5.2). Both share the
interface used here (``BaseTaskBackend``, ``Task``, ``TaskResult``, ``TaskError``, the
signals, ``normalize_json``), so the rest of the package imports it from this one place."""

from __future__ import annotations

from typing import Any

from sqlbroker.core.errors import ConfigurationError

try:
    import django.tasks  # type: ignore[import-not-found,unused-ignore]  # noqa: F401

    NAME = "django.tasks"
except ImportError:
    try:
        import django_tasks  # noqa: F401
    except ImportError as missing:
        raise ConfigurationError(
            "sqlbroker's Django Tasks backend needs Django ≥ 6.0 (django.tasks) or the"
            " django-tasks backport: pip install 'sqlbroker[django]'"
        ) from missing
    NAME = "django_tasks"

if NAME == "django.tasks":
    from django.tasks import base, signals, task_backends  # type: ignore[import-not-found,unused-ignore]
    from django.tasks import exceptions as _exceptions  # type: ignore[import-not-found,unused-ignore]
    from django.tasks.backends.base import (  # type: ignore[import-not-found,unused-ignore]
        BaseTaskBackend,
    )
    from django.utils.json import (  # type: ignore[import-not-found,unused-ignore]
        normalize_json,
    )
else:
    from django_tasks import base, signals, task_backends
    from django_tasks import exceptions as _exceptions
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.utils import normalize_json

Task = base.Task
TaskContext = base.TaskContext
TaskError = base.TaskError
TaskResult = base.TaskResult
TaskResultStatus = base.TaskResultStatus
task = base.task
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist


def set_field(result: Any, name: str, value: Any) -> None:
    """Set a field of a frozen ``TaskResult`` (the framework's own backends do the same)."""
    object.__setattr__(result, name, value)


__all__ = [
    "NAME",
    "BaseTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "set_field",
    "signals",
    "task",
    "task_backends",
]
