"""The dashboard's HTTP surface without a browser: binding rules, tokens, Host and CSRF
checks, the JSON API and the audit of its actions, on both backends."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import sqlbroker
from helpers import claim_one
from sqlbroker.interfaces.dashboard import Dashboard, Extension, Table

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def board(broker: sqlbroker.Broker) -> Iterator[Dashboard]:
    dashboard = Dashboard(broker, port=0)
    dashboard.start()
    yield dashboard
    dashboard.stop()


def call(
    board: Dashboard,
    path: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(board.url.rstrip("/") + path, data=data)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            kind = response.headers.get("Content-Type", "")
            return response.status, json.loads(raw) if "json" in kind else raw.decode()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def poison(broker: sqlbroker.Broker, reason: str = "bad input") -> int:
    broker.send("jobs", {"n": 1})
    broker.dead_letter(claim_one(broker, "jobs"), reason=reason)
    return broker.dead_letters.list()[-1].id


def test_refuses_a_public_bind_without_a_token(broker: sqlbroker.Broker) -> None:
    with pytest.raises(sqlbroker.ConfigurationError, match="token"):
        Dashboard(broker, host="0.0.0.0", port=0)
    with pytest.raises(sqlbroker.InvalidOption):
        Dashboard(broker, port=0, token="short")


def test_page_api_and_security_headers(board: Dashboard, broker: sqlbroker.Broker) -> None:
    broker.send_many("jobs", [1, 2])
    status, page = call(board, "/")
    assert status == 200
    assert board.csrf in page
    assert '<script src="/static/app.js"' in page
    status, overview = call(board, "/api/overview")
    assert status == 200
    assert [(s["subscription"], s["ready"]) for s in overview["subscriptions"]] == [("jobs", 2)]
    assert overview["workers_alive"] == 0
    status, detail = call(board, "/api/subscriptions/jobs")
    assert status == 200
    assert len(detail["pending"]["available"]) == 2
    assert len(detail["series"]) == 60
    assert call(board, "/api/subscriptions/nope")[0] == 404
    assert call(board, "/api/dead/999")[0] == 404
    assert call(board, "/api/nothing")[0] == 404
    with urllib.request.urlopen(board.url, timeout=10) as response:
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Frame-Options"] == "DENY"


def test_wrong_host_header_is_refused(board: Dashboard) -> None:
    status, body = call(board, "/api/overview", headers={"Host": "evil.example:80"})
    assert status == 421
    assert "Host" in body["error"]


def test_actions_need_the_csrf_token_and_are_audited(
    board: Dashboard, broker: sqlbroker.Broker
) -> None:
    dead_id = poison(broker)
    body = {"ids": [dead_id], "actor": "alice", "note": "fixed the bug"}
    assert call(board, "/api/dead/replay", body=body)[0] == 403
    assert call(board, "/api/dead/replay", body=body, headers={"X-CSRF-Token": "nope"})[0] == 403
    cross = {"X-CSRF-Token": board.csrf, "Origin": "http://evil.example"}
    assert call(board, "/api/dead/replay", body=body, headers=cross)[0] == 403
    assert broker.dead_letters.list() != []
    status, result = call(
        board, "/api/dead/replay", body=body, headers={"X-CSRF-Token": board.csrf}
    )
    assert status == 200, result
    assert result["replayed"] == 1
    assert broker.dead_letters.list() == []
    (entry,) = broker.audit()
    assert entry.actor == "dashboard:alice@127.0.0.1"
    assert (entry.action, entry.detail["dead_ids"], entry.detail["note"]) == (
        "dead.replay",
        [dead_id],
        "fixed the bug",
    )
    second = poison(broker)
    purge = {"ids": [second]}
    status, result = call(
        board, "/api/dead/purge", body=purge, headers={"X-CSRF-Token": board.csrf}
    )
    assert (status, result) == (200, {"purged": 1})
    assert broker.audit()[0].actor == "dashboard:anonymous@127.0.0.1"
    bad = call(board, "/api/dead/replay", body={"ids": []}, headers={"X-CSRF-Token": board.csrf})
    assert bad[0] == 400


def test_a_token_guards_everything(broker: sqlbroker.Broker) -> None:
    board = Dashboard(broker, port=0, token=TOKEN)
    board.start()
    try:
        assert call(board, "/api/overview")[0] == 401
        assert call(board, "/")[0] == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert call(board, "/api/overview", headers=bearer)[0] == 200
        assert call(board, "/api/overview", headers={"Authorization": "Bearer wrong"})[0] == 401
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(f"{board.url}?token={TOKEN}", timeout=10) as response:
            assert response.status == 200
            assert board.csrf in response.read().decode()
        with opener.open(f"{board.url}api/overview", timeout=10) as response:
            assert response.status == 200
        assert call(board, f"/?token=wrong-{TOKEN}")[0] == 401
    finally:
        board.stop()


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # a saga started to be shown
def test_extension_pages_plug_in(board: Dashboard, broker: sqlbroker.Broker) -> None:
    status, listed = call(board, "/api/extensions")
    assert status == 200
    assert [(p["name"], p["available"]) for p in listed["pages"]] == [
        ("sagas", True),
        ("schedules", True),
    ]
    assert call(board, "/api/extensions/sagas")[1]["rows"] == []
    checkout = sqlbroker.Saga("checkout", [sqlbroker.Step("reserve"), sqlbroker.Step("charge")])
    saga_id = broker.sagas.start(checkout, {"order": 1})
    (row,) = call(board, "/api/extensions/sagas")[1]["rows"]
    assert row[:4] == [saga_id, "checkout", "running", "reserve: running → charge: pending"]
    broker.schedule("nightly", "reports.nightly", {}, cron="0 3 * * *", tz="Europe/Paris")
    status, schedules = call(board, "/api/extensions/schedules")
    assert status == 200
    assert [row[:4] for row in schedules["rows"]] == [
        ["nightly", "reports.nightly", "0 3 * * *", "Europe/Paris"]
    ]
    board.add_extension(
        Extension("reports", "Reports", lambda b: Table(["name", "next run"], [["x", None]]))
    )
    status, page = call(board, "/api/extensions/reports")
    assert (status, page["columns"], page["rows"]) == (200, ["name", "next run"], [["x", None]])
