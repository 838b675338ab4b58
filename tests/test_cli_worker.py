"""``sqlbroker worker APP``: real worker processes stopped by SIGTERM, and the command's
one-line errors (in process, with click's CliRunner).

Application modules are written into ``tmp_path`` and imported from there, as a user's
would be from their project directory.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import sqlbroker
from sqlbroker.interfaces.cli import cli

APP_MODULE = "tests_app_module"
DEADLINE = 30.0

# Handlers write a line to started.log when they begin, so a test can signal the worker
# while a handler is known to be running. Flaky messages fail their first attempt.
APP_SOURCE = """
from pathlib import Path
import time

import sqlbroker

HERE = Path(__file__).parent
broker = sqlbroker.Broker({url!r})
fast_retry = sqlbroker.RetryPolicy(base=0.01, cap=0.05)


def started(msg):
    with open(HERE / "started.log", "a") as log:
        log.write(f"{{msg.subscription}} {{msg.payload['n']}}\\n")


@broker.subscriber(queue="jobs", concurrency=4, retry=fast_retry)
def handle_job(msg):
    started(msg)
    time.sleep(msg.payload.get("sleep", 0))
    if msg.payload.get("flaky") and msg.attempt == 1:
        raise ConnectionError("upstream hiccup")


@broker.subscriber(topics=["events.#"], name="audit")
async def audit(msg):
    started(msg)
"""

_QUIET_ENV: Mapping[str, str | None] = {
    "SQLBROKER_URL": None,
    "SQLBROKER_DEBUG": None,
    "FORCE_COLOR": None,
    "NO_COLOR": "1",
}


def write_app(directory: Path, url: str, name: str = APP_MODULE) -> Path:
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(APP_SOURCE.format(url=url)), encoding="utf-8")
    return path


def started_lines(directory: Path) -> list[str]:
    log = directory / "started.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def wait_for(condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def start_worker(directory: Path, *args: str) -> subprocess.Popen[str]:
    script = Path(sys.executable).with_name("sqlbroker")
    assert script.exists(), "the sqlbroker console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k not in _QUIET_ENV}
    env["NO_COLOR"] = "1"
    # The URL the worker must *not* use: the app's broker brings its own.
    env["SQLBROKER_URL"] = f"sqlite:///{directory}/not-this-one.db"
    return subprocess.Popen(
        [str(script), "worker", *args],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_worker(process: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM the worker; its exit code and stderr."""
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        raise AssertionError(f"the worker ignored SIGTERM; stderr:\n{stderr}") from None
    return process.returncode, stderr


@pytest.fixture
def worker_process() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes a test started; any still running at teardown are killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


def pending_work(broker: sqlbroker.Broker, *subscriptions: str) -> int:
    return sum(
        s.ready + s.scheduled + s.running + s.blocked
        for s in broker.stats()
        if s.subscription in subscriptions
    )


def test_worker_processes_messages_and_stops_on_sigterm(
    tmp_path: Path, worker_process: list[subprocess.Popen[str]]
) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    write_app(tmp_path, url)
    with sqlbroker.Broker(url) as broker:
        broker.subscribe("audit", ["events.#"])
        jobs = broker.send_many("jobs", [{"n": n, "flaky": n % 3 == 0} for n in range(12)])
        events = broker.publish_many(
            [{"topic": f"events.order.{n}", "payload": {"n": n}} for n in range(5)]
        )

        process = start_worker(tmp_path, f"{APP_MODULE}:broker", "--concurrency", "3")
        worker_process.append(process)
        # More work after the worker is up: it must notice without a restart.
        jobs += broker.send_many("jobs", [{"n": n} for n in range(12, 20)])

        def all_done() -> bool:
            assert process.poll() is None, process.communicate()[1]
            completed = broker.archive(outcome="completed", limit=1000)
            return len(completed) == len(jobs) + len(events) and not pending_work(
                broker, "jobs", "audit"
            )

        wait_for(all_done, "every message to be completed")
        code, stderr = stop_worker(process)

        assert code == 0, stderr
        completed = broker.archive(outcome="completed", limit=1000)
        assert sorted(a.message_id for a in completed if a.subscription == "jobs") == sorted(jobs)
        assert sorted(a.message_id for a in completed if a.subscription == "audit") == sorted(
            events
        )
        retried = {a.payload["n"] for a in completed if a.subscription == "jobs" and a.attempts > 1}
        assert retried == {n for n in range(12) if n % 3 == 0}
        assert broker.dead_letters.list() == []
    # The plain log format at INFO: the start, the retries and the graceful stop.
    assert f"starting {APP_MODULE}:broker on {url}: jobs, audit" in stderr
    assert "INFO    sqlbroker.runtime: received SIGTERM" in stderr
    assert "retrying in" in stderr
    assert "stopped" in stderr.splitlines()[-1]
    assert "Traceback" not in stderr
    assert not (tmp_path / "not-this-one.db").exists()


def test_sigterm_lets_the_running_handler_finish(
    tmp_path: Path, worker_process: list[subprocess.Popen[str]]
) -> None:
    """A graceful stop waits for the running handler; --subscription runs only that one."""
    url = f"sqlite:///{tmp_path}/app.db"
    write_app(tmp_path, url)
    with sqlbroker.Broker(url) as broker:
        broker.subscribe("audit", ["events.#"])
        broker.publish("events.ignored", {"n": 99})
        (slow,) = broker.send_many("jobs", [{"n": 1, "sleep": 1.0}])

        process = start_worker(
            tmp_path,
            APP_MODULE,
            "--subscription",
            "jobs",
            "--grace",
            "20s",
            "--log-level",
            "warning",
        )
        worker_process.append(process)
        wait_for(lambda: started_lines(tmp_path) == ["jobs 1"], "the slow handler to start")
        code, stderr = stop_worker(process)

        assert code == 0, stderr
        assert [a.message_id for a in broker.archive("jobs", outcome="completed")] == [slow]
        # audit was not run: its copy is still waiting.
        assert pending_work(broker, "audit") == 1
    assert started_lines(tmp_path) == ["jobs 1"]
    assert "INFO" not in stderr


# --- errors, in process ----------------------------------------------------------------------


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` as the current directory; the imports and logging setup the command
    does there are undone afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]
    root.setLevel(level)
    root.handlers[:] = handlers


def invoke(*args: str) -> Result:
    return CliRunner(env=_QUIET_ENV).invoke(cli, list(args))


def assert_one_line_error(result: Result, code: int, *needles: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_module_not_found(app_dir: Path) -> None:
    assert_one_line_error(
        invoke("worker", "no_such_app:broker"),
        2,
        "cannot import 'no_such_app'",
        str(app_dir),
    )
    assert_one_line_error(invoke("worker", "no_such_pkg.tasks"), 2, "no module named 'no_such_pkg'")


def test_a_file_name_instead_of_a_module(app_dir: Path) -> None:
    write_app(app_dir, f"sqlite:///{app_dir}/app.db", name="shop")
    """Both ways a file name fails (a dotted ``shop.py`` does not import, a path does not
    parse) give the one hint, in the same words."""
    hint = "; name the module, not its file: shop:broker"
    assert_one_line_error(invoke("worker", "shop.py"), 2, "cannot import 'shop.py'", hint)
    assert_one_line_error(
        invoke("worker", "src/shop.py:broker"),
        2,
        "package.module:attribute",
        f"{hint}, run from src",
    )


def test_attribute_missing(app_dir: Path) -> None:
    write_app(app_dir, f"sqlite:///{app_dir}/app.db", name="shop_missing")
    assert_one_line_error(
        invoke("worker", "shop_missing:app"),
        2,
        "module 'shop_missing' has no attribute 'app'",
        "Broker instances there: broker",
    )


def test_attribute_not_a_broker(app_dir: Path) -> None:
    write_app(app_dir, f"sqlite:///{app_dir}/app.db", name="shop_not_broker")
    assert_one_line_error(
        invoke("worker", "shop_not_broker:fast_retry"),
        2,
        "shop_not_broker:fast_retry is a RetryPolicy, not a sqlbroker.Broker",
    )


def test_no_subscribers(app_dir: Path) -> None:
    (app_dir / "bare_app.py").write_text(
        f"import sqlbroker\nbroker = sqlbroker.Broker('sqlite:///{app_dir}/app.db')\n",
        encoding="utf-8",
    )
    assert_one_line_error(invoke("worker", "bare_app"), 2, "bare_app has no subscribers")


def test_unknown_subscription(app_dir: Path) -> None:
    write_app(app_dir, f"sqlite:///{app_dir}/app.db", name="shop_unknown")
    assert_one_line_error(
        invoke("worker", "shop_unknown", "--subscription", "jobs", "--subscription", "emails"),
        2,
        "no subscriber named 'emails'",
        "registered: jobs, audit",
    )


def test_importing_the_app_fails(app_dir: Path) -> None:
    (app_dir / "broken_app.py").write_text("import sqlbroker\n\n1 / 0\n", encoding="utf-8")
    assert_one_line_error(
        invoke("worker", "broken_app"),
        1,
        "importing 'broken_app' failed at broken_app.py:3: ZeroDivisionError",
        "SQLBROKER_DEBUG",
    )
    (app_dir / "needs_dep.py").write_text("import not_installed_dep\n", encoding="utf-8")
    assert_one_line_error(
        invoke("worker", "needs_dep"), 1, "ModuleNotFoundError", "not_installed_dep"
    )


def test_bad_options(app_dir: Path) -> None:
    write_app(app_dir, f"sqlite:///{app_dir}/app.db", name="shop_options")
    for grace in (["--grace", "-1"], ["--grace=-0.5s"]):
        # Refused by the option's type, in click's usage-error style like every bad value.
        assert_one_line_error(
            invoke("worker", "shop_options", *grace),
            2,
            "Invalid value for '--grace': must not be negative",
            "worker --help",
        )
    result = invoke("worker", "shop_options", "--concurrency", "0")
    assert result.exit_code == 2
    assert "--concurrency" in result.stderr


def test_options_reach_run_and_a_crash_exits_1(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_app(app_dir, f"sqlite:///{app_dir}/app.db", name="shop_crash")
    calls: list[dict[str, Any]] = []

    def crashing_run(self: sqlbroker.Broker, **options: Any) -> None:
        calls.append(options)
        raise sqlbroker.WorkerCrashed("the worker's reaper task died: OSError('disk full')")

    monkeypatch.setattr(sqlbroker.Broker, "run", crashing_run)
    result = invoke(
        "--url",
        "sqlite:///elsewhere.db",
        "worker",
        "shop_crash",
        "--subscription",
        "jobs",
        "--concurrency",
        "7",
        "--grace",
        "2m",
    )
    assert result.exit_code == 1, result.output
    assert calls == [
        {"subscriptions": ["jobs"], "concurrency": 7, "grace": 120.0, "schedules": True}
    ]
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("warning: --url is ignored by the worker")
    assert lines[-1] == "error: the worker's reaper task died: OSError('disk full')"
    assert "Traceback" not in result.output


def test_graceful_stop_exits_0(app_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_app(app_dir, f"sqlite:///{app_dir}/app.db", name="shop_stop")
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        sqlbroker.Broker, "run", lambda self, **options: calls.append(options) or None
    )
    result = invoke("worker", "shop_stop")
    assert result.exit_code == 0, result.output
    assert calls == [{"subscriptions": None, "concurrency": None, "grace": 30.0, "schedules": True}]


def test_help_says_the_url_option_does_not_apply() -> None:
    result = invoke("worker", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "package.module:attribute" in text
    assert "--url option and $SQLBROKER_URL do not apply to this command" in text
    assert "worker" in invoke("--help").stdout
