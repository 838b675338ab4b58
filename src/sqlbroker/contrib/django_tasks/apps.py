from __future__ import annotations

from django.apps import AppConfig


class SqlbrokerTasksConfig(AppConfig):  # type: ignore[misc]
    name = "sqlbroker.contrib.django_tasks"
    label = "sqlbroker_tasks"
    verbose_name = "sqlbroker tasks"
    default_auto_field = "django.db.models.BigAutoField"
