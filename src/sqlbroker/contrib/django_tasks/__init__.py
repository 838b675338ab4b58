"""Django Tasks (``django.tasks``, or the ``django-tasks`` backport before Django 6) on
sqlbroker: add ``"sqlbroker.contrib.django_tasks"`` to ``INSTALLED_APPS``, point
``TASKS["default"]["BACKEND"]`` at ``"sqlbroker.contrib.django_tasks.SqlbrokerBackend"``,
run ``manage.py migrate`` and ``manage.py sqlbroker_worker``. See docs/django.md."""

from __future__ import annotations

from typing import Any

__all__ = ["SqlbrokerBackend"]


def __getattr__(name: str) -> Any:
    # Lazily: Django imports this package while it loads the apps, before the backend's
    # own imports (the Tasks framework, the settings) may run.
    if name == "SqlbrokerBackend":
        from sqlbroker.contrib.django_tasks.backend import SqlbrokerBackend

        return SqlbrokerBackend
    raise AttributeError(name)
