"""What ``get_result`` needs that the queue does not show: the call a task id stands for.

A row is written in the same transaction as the task's message (so both exist or neither)
and holds the call only — task path, arguments, queue, priority: a waiting task's
``TaskResult`` needs them, and sqlbroker shows a waiting message's state but not its
payload. The task's *state*, return value and errors are never copied here: they are read
from sqlbroker (``broker.result``, the archive, the dead letters) each time. Rows are
removed ``RETENTION`` seconds after the task was due by the worker command."""

from __future__ import annotations

from django.db import models


class TaskRecord(models.Model):  # type: ignore[misc]
    id = models.UUIDField(primary_key=True)
    """The sqlbroker message id, also the ``TaskResult.id``."""
    task_path = models.CharField(max_length=255)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    backend = models.CharField(max_length=100)
    queue_name = models.CharField(max_length=100)
    priority = models.IntegerField(default=0)
    run_after = models.DateTimeField(null=True)
    enqueued_at = models.DateTimeField()
    keep_until = models.DateTimeField(db_index=True)

    class Meta:
        # Not ``sqlbroker_…``: that prefix names the broker's own tables, which
        # ``sqlbroker roles`` grants to the broker's roles.
        db_table = "django_sqlbroker_task"
