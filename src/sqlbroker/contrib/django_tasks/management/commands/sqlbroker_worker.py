"""``python manage.py sqlbroker_worker``: run the tasks of a sqlbroker task backend.

Stops gracefully on SIGTERM or Ctrl-C: no new task is started, running ones finish within
``--grace`` seconds, and what it had claimed but not started goes back to the queue. A
worker killed outright loses nothing either: its tasks are delivered again once their lease
runs out (``settings.SQLBROKER['OPTIONS']['lease']``, 30 s by default)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sqlbroker.core.errors import SqlbrokerError


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run Django tasks from sqlbroker queues (a sqlbroker worker)."
    # Checked in handle(), where a misconfigured backend (raised while the checks import
    # the project's tasks) becomes one CommandError line rather than a traceback.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend", default="default", help="the TASKS alias to run (default: default)"
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            help="a queue to run (repeatable; default: every queue of the backend's QUEUES)",
        )
        parser.add_argument(
            "--concurrency", type=int, default=4, help="tasks run at once per queue (default 4)"
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=None,
            help="seconds after which a running task counts as failed (default: no limit)",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=30.0,
            help="seconds running tasks get to finish on shutdown (default 30)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from sqlbroker.contrib.django_tasks.execution import (
            backend_named,
            trimming,
            worker_broker,
        )

        try:
            if not options.get("skip_checks"):
                self.check()
            backend = backend_named(options["backend"])
            queues = options["queues"] or sorted(backend.queues)
            broker = worker_broker(
                backend, queues, concurrency=options["concurrency"], timeout=options["timeout"]
            )
        except SqlbrokerError as error:
            raise CommandError(str(error)) from error
        names = ", ".join(backend.sqlbroker_queue(name) for name in queues)
        self.stdout.write(f"sqlbroker worker for tasks of {backend.alias!r} on {names}")
        self.stdout.flush()
        try:
            with trimming(backend):
                broker.run(grace=options["grace"])
        finally:
            broker.close()
