"""``sqlbroker saga list | show``: in process, on both backends."""

from __future__ import annotations

import json

import pytest

import sqlbroker
from sqlbroker import Saga, Step
from test_cli import ok, run

# Sagas started only to be listed: no handler anywhere, which the start warns of.
pytestmark = pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")

ORDER = Saga("order", [Step("reserve"), Step("charge", compensate=False)])


def test_saga_list_and_show(broker: sqlbroker.Broker, backend_url: str) -> None:
    broker.sagas.start(ORDER, {"sku": "A-1"}, saga_id="order-1")
    broker.sagas.start(ORDER, {"sku": "B-2"}, saga_id="order-2")
    listed = ok(backend_url, "saga", "list").stdout
    assert "order-1" in listed
    assert "running" in listed
    rows = json.loads(ok(backend_url, "saga", "list", "--status", "running", "--json").stdout)
    assert {row["id"] for row in rows} == {"order-1", "order-2"}
    assert ok(backend_url, "saga", "list", "--status", "failed").stdout.strip() == "no sagas"
    shown = ok(backend_url, "saga", "show", "order-1").stdout
    assert "A-1" in shown
    assert "reserve" in shown
    assert "charge (no undo)" in shown
    detail = json.loads(ok(backend_url, "saga", "show", "order-2", "--json").stdout)
    assert detail["data"] == {"sku": "B-2"}
    assert [step["status"] for step in detail["steps"]] == ["running", "pending"]
    missing = run(backend_url, "saga", "show", "nope")
    assert missing.exit_code != 0
    assert "no saga" in missing.stderr
