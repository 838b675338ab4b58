"""``sqlbroker worker --metrics-port --log-format json``, ``sqlbroker metrics`` and
``sqlbroker healthcheck`` against real worker processes and databases."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import sqlbroker
from sqlbroker.core.observability import WorkerBeat
from sqlbroker.interfaces.cli import cli
from test_cli_worker import (
    APP_MODULE,
    pending_work,
    start_worker,
    stop_worker,
    wait_for,
    write_app,
)

ENV = {"SQLBROKER_URL": None, "SQLBROKER_DEBUG": None, "NO_COLOR": "1"}


def run(url: str, *args: str) -> Result:
    return CliRunner(env=ENV).invoke(cli, ["--url", url, *args])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus text exposition, or ``None``."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        found = dict(
            part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part
        )
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return None


def test_worker_serves_metrics_logs_json_and_passes_the_healthcheck(
    tmp_path: Path, worker_process: list[subprocess.Popen[str]]
) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    write_app(tmp_path, url)
    port = free_port()
    with sqlbroker.Broker(url) as broker:
        broker.subscribe("audit", ["events.#"])
        broker.send_many("jobs", [{"n": n, "flaky": n % 2 == 0} for n in range(6)])
        process = start_worker(
            tmp_path,
            f"{APP_MODULE}:broker",
            "--metrics-port",
            str(port),
            "--log-format",
            "json",
        )
        worker_process.append(process)

        def done() -> bool:
            assert process.poll() is None, process.communicate()[1]
            totals = broker.backend.metric_totals()
            return totals.get(("jobs", "completed")) == 6 and not pending_work(broker, "jobs")

        wait_for(done, "the jobs to be completed and counted")
        text = scrape(port)
        assert sample(text, "sqlbroker_up") == 1
        assert (
            sample(text, "sqlbroker_messages_total", subscription="jobs", outcome="completed") == 6
        )
        assert sample(text, "sqlbroker_messages_total", subscription="jobs", outcome="retried") == 3
        assert sample(text, "sqlbroker_messages_ready", subscription="jobs") == 0
        assert sample(text, "sqlbroker_workers_alive") == 1
        assert sample(text, "sqlbroker_handler_duration_seconds_count", subscription="jobs") == 9
        assert sample(text, "sqlbroker_handler_errors_total", subscription="jobs") == 3

        healthy = run(url, "healthcheck", "--json")
        assert healthy.exit_code == 0, healthy.output
        assert json.loads(healthy.stdout)["status"] == "healthy"

        code, stderr = stop_worker(process)
        assert code == 0, stderr
        after = run(url, "healthcheck", "--probe", "liveness")
        assert after.exit_code == 1, after.output
        assert "no worker seen" in after.stdout

    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    retries = [r for r in records if "retrying in" in r["message"]]
    assert len(retries) == 3
    assert {r["subscription"] for r in retries} == {"jobs"}
    assert all(r["attempt"] == 1 and r["error_type"] == "ConnectionError" for r in retries)
    assert all("flaky" not in json.dumps(r) for r in records), "a payload was logged"
    assert records[-1]["level"] == "info"


def test_metrics_once_prints_database_metrics(backend_url: str, broker: sqlbroker.Broker) -> None:
    broker.send_many("emails", [1, 2, 3])
    broker.publish("nobody.listens", 1)
    result = run(backend_url, "metrics", "--once")
    assert result.exit_code == 0, result.output
    assert sample(result.stdout, "sqlbroker_messages_ready", subscription="emails") == 3
    assert sample(result.stdout, "sqlbroker_unrouted_messages") == 1
    assert sample(result.stdout, "sqlbroker_workers_alive") == 0
    assert "# TYPE sqlbroker_messages_total counter" in result.stdout


def test_healthcheck_readiness_fails_on_lag_with_a_live_worker(backend_url: str) -> None:
    past = sqlbroker.ManualClock(datetime.now(UTC) - timedelta(hours=1))
    with sqlbroker.Broker(backend_url, clock=past, migrate=True) as old:
        old.send("slow", "waiting for an hour")
    with sqlbroker.Broker(backend_url) as broker:
        beat = WorkerBeat(name="probe:1", host="probe", pid=1, subscriptions=("slow",))
        broker.backend.worker_beat(beat=beat, minutes=[], totals={})
    live = run(backend_url, "healthcheck", "--probe", "liveness")
    assert live.exit_code == 0, live.output
    ready = run(backend_url, "healthcheck", "--max-lag", "10m", "--json")
    assert ready.exit_code == 3, ready.output
    report = json.loads(ready.stdout)
    assert report["status"] == "not ready"
    assert [c["name"] for c in report["checks"] if not c["ok"]] == ["lag"]
    assert run(backend_url, "healthcheck", "--max-lag", "2h").exit_code == 0
    # A subscription that does not exist is not ready, not a lag of nothing.
    missing = run(backend_url, "healthcheck", "--subscription", "other", "--max-lag", "1")
    assert missing.exit_code == 3, missing.output
    assert "no subscription named 'other'" in missing.stdout
    with sqlbroker.Broker(backend_url) as broker:
        broker.subscribe("other", "other")
    assert (
        run(backend_url, "healthcheck", "--subscription", "other", "--max-lag", "1").exit_code == 0
    )


def test_healthcheck_fails_when_the_database_is_unreachable() -> None:
    result = run("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", "healthcheck")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.stdout


@pytest.mark.parametrize("option", ["--max-lag", "--max-heartbeat-age"])
def test_healthcheck_rejects_a_zero_threshold(tmp_path: Path, option: str) -> None:
    result = run(f"sqlite:///{tmp_path}/x.db", "healthcheck", option, "0")
    assert result.exit_code == 2
