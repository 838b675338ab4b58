"""Flow limit changes are audited (issue 26 item 3; docs/flow-control.md), both backends:
``set_flow`` and the CLI record who changed which limits, before and after; setting the
limits a subscription already has records nothing, and a worker declaring its
subscriber's limits records nothing (a worker's role may not write the audit trail)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

import sqlbroker
from helpers import table_counts
from sqlbroker.interfaces.cli import cli


def _flow_changes(broker: sqlbroker.Broker) -> list[Any]:
    return [e for e in broker.audit(limit=100) if e.action == "subscription.flow"]


def test_set_flow_is_audited_with_the_limits_before_and_after(broker: sqlbroker.Broker) -> None:
    broker.subscribe("orders", "order.*")
    broker.set_flow("orders", max_running=3, rate_limit="100/min", actor="ops", note="PSP limit")
    broker.set_flow("orders", max_running=3)  # no change: nothing recorded
    broker.set_flow("orders", fair=True)
    latest, first = _flow_changes(broker)
    assert (first.actor, first.detail["subscription"], first.detail["note"]) == (
        "ops",
        "orders",
        "PSP limit",
    )
    assert first.detail["before"] == {
        "max_running": None,
        "key_concurrency": None,
        "rate_limit": None,
        "key_rate_limit": None,
        "fair": False,
    }
    assert first.detail["after"] == {
        "max_running": 3,
        "key_concurrency": None,
        "rate_limit": "100/min",
        "key_rate_limit": None,
        "fair": False,
    }
    assert latest.actor.startswith("api")
    assert (latest.detail["before"], latest.detail["after"]["fair"]) == (
        first.detail["after"],
        True,
    )


@pytest.mark.parametrize(
    "options", [{"actor": ""}, {"actor": 7}, {"note": " "}, {"note": "a\x00b"}]
)
def test_a_bad_actor_or_note_writes_nothing(
    broker: sqlbroker.Broker, options: dict[str, Any]
) -> None:
    broker.subscribe("orders", "order.*")
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.ValidationError):
        broker.set_flow("orders", max_running=2, **options)
    assert table_counts(broker.backend) == before
    assert broker.flow("orders")[0].limits == sqlbroker.FlowLimits()


def test_the_cli_is_audited_and_a_workers_declared_limits_are_not(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("orders", "order.*")
    result = CliRunner().invoke(
        cli, ["--url", backend_url, "subscriptions", "flow", "orders", "--max-running", "4"]
    )
    assert result.exit_code == 0, result.output
    with sqlbroker.Broker(backend_url) as broker:
        broker.send("reports", 1)

        @broker.subscriber(queue="reports", max_running=2)
        def build(msg: sqlbroker.Message) -> None:
            pass

        broker.run_until_idle(timeout=60)
        (cli_change,) = _flow_changes(broker)
        assert broker.flow("reports")[0].limits.max_running == 2
    assert cli_change.actor.startswith("cli")
    assert cli_change.detail["after"]["max_running"] == 4
