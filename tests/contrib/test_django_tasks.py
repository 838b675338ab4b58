"""Django Tasks on sqlbroker, in a real Django project (tests/contrib/djangoproject: its own
settings, app and migrations) run as real processes: ``manage.py migrate``, ``manage.py
shell -c`` to enqueue and read results, ``manage.py sqlbroker_worker`` to run the tasks —
on a SQLite file and on PostgreSQL, one database for the shop, the task records and the
queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import sqlbroker

pytest.importorskip("django")
pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parent / "djangoproject"
SRC = Path(__file__).resolve().parents[2] / "src"
WAIT = 90.0


@dataclass
class Project:
    url: str
    directory: Path
    env: dict[str, str]
    workers: list[subprocess.Popen[str]] = field(default_factory=list)

    def manage(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(PROJECT / "manage.py"), *args],
            cwd=self.directory,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=WAIT * 2,
            check=False,
        )

    def shell(self, code: str) -> Any:
        """Run ``code`` in ``manage.py shell``; it prints one JSON value last."""
        done = self.manage("shell", "-c", textwrap.dedent(code))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def worker(self, *args: str) -> subprocess.Popen[str]:
        with (self.directory / f"worker{len(self.workers)}.log").open("w") as log:
            process = subprocess.Popen(
                [sys.executable, str(PROJECT / "manage.py"), "sqlbroker_worker", *args],
                cwd=self.directory,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self.workers.append(process)
        return process

    def log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.directory.glob("worker*.log")))

    def broker(self) -> sqlbroker.Broker:
        return sqlbroker.Broker(self.url)


def _wait(condition: Callable[[], bool], what: str, project: Project) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}:\n{project.log()}")
        time.sleep(0.2)


def _stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=WAIT)


@pytest.fixture
def project(backend_url: str, tmp_path: Path) -> Iterator[Project]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQLBROKER_", "TASKS_"))}
    env.update(
        TASKS_DATABASE_URL=backend_url,
        TASKS_BROKER_OPTIONS=json.dumps({"lease": 2}),
        DJANGO_SETTINGS_MODULE="taskproject.settings",
        PYTHONPATH=os.pathsep.join([str(SRC), str(PROJECT)]),
    )
    made = Project(backend_url, tmp_path, env)
    migrated = made.manage("migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    yield made
    for process in made.workers:
        if process.poll() is None:
            process.kill()
            process.wait()


def _finished(project: Project, completed: int, dead: int = 0) -> Callable[[], bool]:
    def check() -> bool:
        with project.broker() as broker:
            done = sum(
                len(broker.archive(queue, outcome="completed", limit=1000))
                for queue in ("tasks.default", "tasks.emails")
            )
            return done >= completed and len(broker.dead_letters.list()) >= dead

    return check


def test_tasks_run_by_priority_queue_and_run_after_and_report_their_results(
    project: Project,
) -> None:
    ids = project.shell(
        """
        import asyncio
        import json
        from datetime import timedelta
        from django.utils import timezone
        from shop.tasks import arecord, boom, email, record, shaped, unstorable

        low = [record.using(priority=-10).enqueue(n).id for n in (1, 2, 3)]
        high = [record.using(priority=50).enqueue(n).id for n in (10, 11, 12)]
        later = record.using(run_after=timezone.now() + timedelta(seconds=2)).enqueue(40)
        ids = {"low": low, "high": high, "email": email.enqueue(20).id,
               "boom": boom.enqueue(30).id, "later": later.id,
               "async": asyncio.run(arecord.aenqueue(50)).id,
               "run_after": later.task.run_after.isoformat(),
               "shaped": shaped.enqueue(60).id, "unstorable": unstorable.enqueue(70).id}
        ids["before"] = [record.get_result(i).status for i in low + high]
        print(json.dumps(ids))
        """
    )
    assert set(ids["before"]) == {"READY"}
    worker = project.worker("--concurrency", "1")
    _wait(_finished(project, completed=10, dead=2), "the tasks to run", project)
    assert _stop(worker) == 0, project.log()

    results = project.shell(
        f"""
        import json
        from sqlbroker.contrib.django_tasks.framework import task_backends
        from shop.models import Done

        ids = {ids!r}
        backend = task_backends["default"]
        out = {{}}
        for name in ("low", "high"):
            out[name] = [backend.get_result(i).status for i in ids[name]]
            out[name + "_values"] = [backend.get_result(i).return_value for i in ids[name]]
        def value_error(result):
            try:
                result.return_value
            except ValueError as error:
                return str(error)
        out["shaped"] = backend.get_result(ids["shaped"]).return_value
        bad = backend.get_result(ids["unstorable"])
        out["unstorable"] = [bad.status, bad.errors[0].exception_class.__name__,
                             bad.errors[0].traceback.splitlines()[-1], bad.attempts,
                             value_error(bad)]
        failed = backend.get_result(ids["boom"])
        out["boom"] = [failed.status, failed.errors[0].exception_class.__name__,
                       failed.errors[0].traceback, failed.attempts, failed.task.name]
        email = backend.get_result(ids["email"])
        out["email"] = [email.status, email.task.queue_name, email.attempts,
                        email.finished_at >= email.started_at >= email.enqueued_at,
                        email.return_value]
        out["order"] = list(Done.objects.filter(task="record").order_by("id")
                            .values_list("number", flat=True))
        out["later_done_at"] = Done.objects.get(number=40).done_at.isoformat()
        out["async"] = [backend.get_result(ids["async"]).status,
                        backend.get_result(ids["async"]).return_value,
                        list(Done.objects.filter(task="arecord").values_list("number", flat=True))]
        print(json.dumps(out))
        """
    )
    assert results["low"] == results["high"] == ["SUCCESSFUL"] * 3
    assert results["low_values"] == [1, 2, 3], "what each task returned"
    assert results["high_values"] == [10, 11, 12]
    assert results["email"] == ["SUCCESSFUL", "emails", 1, True, None]
    assert results["shaped"] == {"number": 60, "7": [60, "bytes"]}, "Django's normalisation"
    kind, last_line, attempts, why = results["unstorable"][1:]
    assert results["unstorable"][0] == "FAILED", "Django fails a task it cannot keep the value of"
    assert (kind, attempts, why) == ("TypeError", 1, "Task failed")
    assert "Unsupported type" in last_line
    status, kind, trace, attempts, name = results["boom"]
    assert (status, kind, attempts, name) == ("FAILED", "ValueError", 1, "boom")
    assert "boom 30" in trace
    order = results["order"]
    assert sorted(order) == [1, 2, 3, 10, 11, 12, 40]
    assert max(order.index(n) for n in (10, 11, 12)) < min(order.index(n) for n in (1, 2, 3))
    assert results["later_done_at"] >= ids["run_after"]
    assert results["async"] == ["SUCCESSFUL", None, [50]], "a coroutine task, from async code"


def test_enqueue_joins_the_request_transaction(project: Project) -> None:
    out = project.shell(
        """
        import json
        from datetime import timedelta
        from django.db import transaction
        from django.test import Client
        from django.utils import timezone
        from sqlbroker.contrib.django import get_broker
        from sqlbroker.contrib.django_tasks.execution import trim_records
        from sqlbroker.contrib.django_tasks.framework import task_backends
        from sqlbroker.contrib.django_tasks.models import TaskRecord
        from shop.models import Order
        from shop.tasks import record

        class RolledBack(Exception):
            pass

        try:
            with transaction.atomic():
                rolled_back = record.enqueue(1).id
                raise RolledBack
        except RolledBack:
            pass
        try:
            task_backends["default"].get_result(rolled_back)
            found = True
        except Exception as error:
            found = type(error).__name__
        client = Client(raise_request_exception=False)
        ok = client.get("/orders/", {"item": "mug"})
        failed = client.get("/orders/", {"item": "cup", "fail": "1"})
        pending = [m.message_id for m in get_broker().pending("tasks.default")]
        out = {"found": found, "statuses": [ok.status_code, failed.status_code],
               "orders": list(Order.objects.values_list("item", flat=True)),
               "pending": pending, "committed": ok.content.decode(),
               "records": TaskRecord.objects.count()}
        TaskRecord.objects.update(keep_until=timezone.now() - timedelta(seconds=1))
        out["trimmed"] = trim_records(task_backends["default"])
        print(json.dumps(out))
        """
    )
    assert out["found"] == "TaskResultDoesNotExist"
    assert out["statuses"] == [200, 500]
    assert out["orders"] == ["mug"], "the failed request's order rolled back"
    assert out["pending"] == [out["committed"]], "and so did its task; the other one waits"
    assert out["records"] == 1
    assert out["trimmed"] == 1


def test_a_killed_worker_loses_no_task(project: Project) -> None:
    marker = project.directory / "slow-started"
    ids = project.shell(
        f"""
        import json
        from shop.tasks import record, slow

        slow_id = slow.enqueue(1, {str(marker)!r}).id
        print(json.dumps({{"slow": slow_id,
                           "records": [record.enqueue(n).id for n in range(2, 22)]}}))
        """
    )
    first = project.worker("--concurrency", "4")
    _wait(marker.exists, "the slow task to start", project)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=WAIT)
    running = project.shell(
        f"""
        import json
        from shop.tasks import slow
        print(json.dumps(slow.get_result({ids["slow"]!r}).status))
        """
    )
    assert running == "RUNNING", "the dead worker's lease has not been reaped yet"

    second = project.worker("--concurrency", "4")
    _wait(_finished(project, completed=21), "every task, the killed one again", project)
    assert _stop(second) == 0, project.log()
    out = project.shell(
        f"""
        import json
        from shop.models import Done
        from shop.tasks import slow
        result = slow.get_result({ids["slow"]!r})
        print(json.dumps({{
            "status": result.status, "attempts": result.attempts, "value": result.return_value,
            "slow": list(Done.objects.filter(task="slow").values_list("attempt", flat=True)),
            "records": sorted(set(Done.objects.filter(task="record")
                                  .values_list("number", flat=True))),
        }}))
        """
    )
    assert out["status"] == "SUCCESSFUL"
    assert out["attempts"] == 2
    assert out["value"] == {"number": 1, "attempt": 2}, "stored by the second worker, read after"
    assert out["slow"] == [2], "the killed attempt wrote nothing; the redelivery finished it"
    assert out["records"] == list(range(2, 22)), "nothing lost"


def test_retries_run_a_failing_task_again_before_it_fails(project: Project) -> None:
    project.env["TASKS_OPTIONS"] = json.dumps({"RETRIES": 1})
    failing, bad, big = project.shell(
        """
        import json
        from shop.tasks import boom, oversized, unstorable
        print(json.dumps([boom.enqueue(7).id, unstorable.enqueue(8).id, oversized.enqueue(9).id]))
        """
    )
    worker = project.worker()
    _wait(_finished(project, completed=0, dead=3), "the tasks to fail", project)
    assert _stop(worker) == 0, project.log()
    result = project.shell(
        f"""
        import json
        from shop.models import Done
        from shop.tasks import boom, oversized, unstorable
        result = boom.get_result({failing!r})
        bad = unstorable.get_result({bad!r})
        big = oversized.get_result({big!r})
        print(json.dumps([result.status, result.attempts, result.errors[0].traceback,
                          [bad.status, bad.attempts, bad.errors[0].exception_class.__name__,
                           Done.objects.filter(task="unstorable").count()],
                          [big.status, big.attempts, big.errors[0].exception_class.__name__]]))
        """
    )
    status, attempts, trace, unstorable, oversized = result
    assert (status, attempts) == ("FAILED", 2)
    assert "boom 7" in trace
    assert unstorable == ["FAILED", 1, "TypeError", 1], "its value would not change: not retried"
    assert oversized == ["FAILED", 1, "InvalidPayload"], "over the payload limit: the same"


def test_a_result_past_result_ttl_is_no_longer_found(project: Project) -> None:
    """Stored results are trimmed after the broker's ``result_ttl``: then the task's result
    does not exist, as in Django's own backends once their results are pruned; a failed
    task's error stays with its dead letter."""
    project.env["TASKS_BROKER_OPTIONS"] = json.dumps({"lease": 2, "result_ttl": 1})
    done, failed = project.shell(
        """
        import json
        from shop.tasks import boom, record
        print(json.dumps([record.enqueue(5).id, boom.enqueue(6).id]))
        """
    )
    worker = project.worker()
    _wait(_finished(project, completed=1, dead=1), "the tasks to finish", project)
    assert _stop(worker) == 0, project.log()

    def trimmed() -> bool:
        with sqlbroker.Broker(project.url, result_ttl=1) as broker:
            broker.reap()
            try:
                broker.result(done)
            except sqlbroker.NotFound:
                return True
            return False

    _wait(trimmed, "the result to be trimmed", project)
    out = project.shell(
        f"""
        import json
        from shop.tasks import boom, record
        from sqlbroker.contrib.django_tasks.framework import TaskResultDoesNotExist
        try:
            record.get_result({done!r})
            gone = "found"
        except TaskResultDoesNotExist as error:
            gone = str(error)
        print(json.dumps([gone, boom.get_result({failed!r}).status]))
        """
    )
    gone, status = out
    assert "no longer kept" in gone
    assert status == "FAILED"


def test_the_system_check_names_a_missing_app_and_a_deferred_sqlite(project: Project) -> None:
    checked = project.manage("check", env={"TASKS_WITHOUT_APP": "1", "TASKS_SQLITE_DEFERRED": "1"})
    assert checked.returncode == 1
    assert "sqlbroker.E001" in checked.stderr
    if project.url.startswith("sqlite"):
        assert "sqlbroker.W001" in checked.stderr
    else:
        assert "sqlbroker.W001" not in checked.stderr


@pytest.mark.parametrize(
    ("settings", "arguments", "says"),
    [
        ({"TASKS_OPTIONS": '{"RETRIEZ": 1}'}, (), "has unknown keys ['RETRIEZ']"),
        ({"TASKS_OPTIONS": '{"QUEUE_PREFIX": "bad prefix "}'}, (), "queue"),
        ({}, ("--backend", "other"), "settings.TASKS has no backend named 'other'"),
        ({}, ("--queue", "nope"), "queue 'nope' is not in TASKS['default']['QUEUES']"),
        ({"TASKS_BROKER_URL": "redis://localhost/0"}, (), "redis"),
    ],
)
def test_bad_configuration_is_one_clear_error(
    project: Project, settings: dict[str, str], arguments: tuple[str, ...], says: str
) -> None:
    done = project.manage("sqlbroker_worker", *arguments, env=settings)
    assert done.returncode == 1
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_without_the_tasks_framework_the_error_says_what_to_install() -> None:
    """Neither ``django.tasks`` (Django ≥ 6) nor the backport importable: one clear error."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["django.tasks"] = None
        sys.modules["django_tasks"] = None
        import sqlbroker
        try:
            import sqlbroker.contrib.django_tasks.framework
        except sqlbroker.ConfigurationError as error:
            print(error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    assert "pip install 'sqlbroker[django]'" in done.stdout, done.stderr
