"""The dashboard end to end in a real headless Chromium (Debian's ``chromium``, driven by
Playwright; no browser is downloaded): the overview follows publishes, a dead letter is
replayed from the page and completes, and hostile text stays text. Both backends."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlbroker
from helpers import claim_one
from sqlbroker.interfaces.dashboard import Dashboard

CHROMIUM = os.environ.get("SQLBROKER_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
        reason="Debian's chromium is not installed (make chromium)",
    ),
]
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


@pytest.fixture
def page() -> Iterator[object]:
    with playwright_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1300, "height": 900})
            yield context.new_page()
        finally:
            browser.close()


@pytest.fixture
def board(broker: sqlbroker.Broker) -> Iterator[Dashboard]:
    dashboard = Dashboard(broker, port=0, refresh=0.3)
    dashboard.start()
    yield dashboard
    dashboard.stop()


def test_overview_follows_publishes_and_a_replayed_dead_letter_completes(
    broker: sqlbroker.Broker, board: Dashboard, page: object
) -> None:
    handled: list[object] = []

    @broker.subscriber(queue="jobs")
    def handle(msg: sqlbroker.Message) -> None:
        handled.append(msg.payload)

    broker.subscribe("jobs", ["jobs"])
    page.goto(board.url)  # type: ignore[attr-defined]
    row = page.locator('[data-subscription="jobs"]')  # type: ignore[attr-defined]
    expect(row.get_by_test_id("ready")).to_have_text("0")
    broker.send_many("jobs", [1, 2, 3])
    expect(row.get_by_test_id("ready")).to_have_text("3")
    broker.send("jobs", 4)
    expect(row.get_by_test_id("ready")).to_have_text("4")

    for delivery in broker.claim("jobs", limit=4):
        broker.dead_letter(delivery, reason="downstream was down")
    expect(row.get_by_test_id("dead")).to_have_text("4")
    expect(page.get_by_test_id("total-dead")).to_have_text("4")  # type: ignore[attr-defined]

    page.get_by_role("link", name="Dead letters").click()  # type: ignore[attr-defined]
    table = page.get_by_test_id("dead-letters")  # type: ignore[attr-defined]
    expect(table.locator("tbody tr")).to_have_count(4)
    first = broker.dead_letters.list()[0].id
    table.locator(f'[data-dead-id="{first}"]').get_by_test_id("select-dead").check()
    page.get_by_test_id("replay-selected").click()  # type: ignore[attr-defined]
    dialog = page.get_by_test_id("confirm-dialog")  # type: ignore[attr-defined]
    expect(dialog).to_be_visible()
    dialog.get_by_label("Your name").fill("tester")
    dialog.get_by_label("Why").fill("downstream is back")
    dialog.get_by_test_id("confirm-ok").click()
    expect(page.get_by_test_id("notice")).to_have_text("Replayed 1 dead letter(s).")  # type: ignore[attr-defined]
    expect(table.locator("tbody tr")).to_have_count(3)
    audit = page.get_by_test_id("audit")  # type: ignore[attr-defined]
    expect(audit).to_contain_text("dashboard:tester@127.0.0.1")
    expect(audit).to_contain_text("downstream is back")

    # Replay the rest at once: select all, confirm.
    page.get_by_test_id("select-all").check()  # type: ignore[attr-defined]
    page.get_by_test_id("replay-selected").click()  # type: ignore[attr-defined]
    dialog.get_by_test_id("confirm-ok").click()
    expect(page.get_by_test_id("notice")).to_have_text("Replayed 3 dead letter(s).")  # type: ignore[attr-defined]
    expect(table).to_contain_text("no dead letters")

    runner = threading.Thread(
        target=broker.run,
        kwargs={"install_signal_handlers": False, "heartbeat_interval": 0.2},
    )
    runner.start()
    try:
        page.get_by_role("link", name="Overview").click()  # type: ignore[attr-defined]
        expect(page.get_by_test_id("workers-alive")).to_have_text("1")  # type: ignore[attr-defined]
        expect(row.get_by_test_id("ready")).to_have_text("0")
        expect(row.get_by_test_id("dead")).to_have_text("0")
        expect(row.get_by_test_id("completed-rate")).not_to_have_text("0.0")
        assert sorted(handled) == [1, 2, 3, 4]
        page.get_by_test_id("subscription-link").click()  # type: ignore[attr-defined]
        expect(page.get_by_test_id("throughput-chart")).to_be_visible()  # type: ignore[attr-defined]
        expect(page.get_by_test_id("latency-chart")).to_be_visible()  # type: ignore[attr-defined]
    finally:
        broker.stop()
        runner.join(20)
    assert broker.archive("jobs", outcome="completed", limit=10)[0].replay_count == 1


def test_hostile_text_is_shown_as_text(
    broker: sqlbroker.Broker, board: Dashboard, page: object
) -> None:
    broker.send("jobs", {"note": HOSTILE}, headers={"x-html": HOSTILE})
    broker.dead_letter(claim_one(broker, "jobs"), reason=HOSTILE)
    dead_id = broker.dead_letters.list()[0].id
    page.goto(f"{board.url}#/dead")  # type: ignore[attr-defined]
    expect(page.get_by_test_id("dead-letters")).to_contain_text(HOSTILE)  # type: ignore[attr-defined]
    page.goto(f"{board.url}#/dead/{dead_id}")  # type: ignore[attr-defined]
    expect(page.get_by_test_id("payload")).to_contain_text(HOSTILE.replace('"', '\\"'))  # type: ignore[attr-defined]
    expect(page.get_by_test_id("dead-facts")).to_contain_text(HOSTILE)  # type: ignore[attr-defined]
    assert page.evaluate("window.__pwned") is None  # type: ignore[attr-defined]
    assert page.locator("main img").count() == 0  # type: ignore[attr-defined]
    page.get_by_test_id("purge-one").click()  # type: ignore[attr-defined]
    page.get_by_test_id("confirm-cancel").click()  # type: ignore[attr-defined]
    assert broker.dead_letters.list() != []
    page.goto(f"{board.url}#/x/sagas")  # type: ignore[attr-defined]
    expect(page.get_by_test_id("extension-sagas")).to_be_visible()  # type: ignore[attr-defined]
    expect(page.locator("main")).to_contain_text("No sagas yet")  # type: ignore[attr-defined]


def test_one_minute_of_handler_times_is_drawn(
    broker: sqlbroker.Broker, board: Dashboard, page: object
) -> None:
    """Issue 23 item 16: with one minute of data the handler-time chart has one value per
    series, which a line alone does not draw; each is marked with a point."""

    @broker.subscriber(queue="fresh")
    def handle(msg: sqlbroker.Message) -> None:
        pass

    broker.send_many("fresh", [1, 2, 3])
    # Playwright's sync API holds this thread's event loop: the worker runs beside it.
    worker = threading.Thread(target=broker.run_until_idle, kwargs={"timeout": 30})
    worker.start()
    worker.join(40)
    page.goto(board.url)  # type: ignore[attr-defined]
    page.get_by_test_id("subscription-link").click()  # type: ignore[attr-defined]
    latency = page.get_by_test_id("latency-chart")  # type: ignore[attr-defined]
    expect(latency).to_be_visible()
    expect(latency.locator("circle.point")).to_have_count(2)  # p50 and p95
