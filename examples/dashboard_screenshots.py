"""Screenshots of every dashboard page, for docs/dashboard/.

Run ``make demo`` first, then ``.venv/bin/python examples/dashboard_screenshots.py``. The
demo's database is copied, so the replay this script does through the page (to show the
audit) leaves the original alone; the copy also gets the two checkouts of
``examples/checkout_saga.py`` and two schedules, for the Sagas and Schedules pages. Needs
Debian's chromium and the playwright package.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import tempfile
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from sqlbroker import Broker
from sqlbroker.interfaces.dashboard import Dashboard

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", type=Path, default=REPO / ".demo" / "demo.db")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "demo.db"
        shutil.copy(args.db, copy)
        _add_checkouts(f"sqlite:///{copy}")
        with Broker(f"sqlite:///{copy}") as broker:
            broker.schedule("nightly-report", "reports.nightly", {"kind": "daily"}, every=86400)
            broker.schedule("heartbeat", "ops.heartbeat", {}, every=30, missed="skip")
            board = Dashboard(broker, port=0, refresh=1.0)
            board.start()
            try:
                shoot(board, broker, args.out, args.chromium)
            finally:
                board.stop()


def _add_checkouts(url: str) -> None:
    """The two orders of examples/checkout_saga.py (one completed, one compensated)."""
    spec = importlib.util.spec_from_file_location(
        "checkout_saga", REPO / "examples" / "checkout_saga.py"
    )
    assert spec is not None
    assert spec.loader is not None
    checkout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checkout)
    app = checkout.make_broker(url)
    with app.backend.begin() as tx:
        conn = tx.connection
        conn.execute("CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INTEGER)")
        conn.execute("INSERT OR REPLACE INTO stock VALUES ('mug', 10)")
    app.sagas.start(
        checkout.CHECKOUT,
        {"sku": "mug", "quantity": 2, "amount": 19.8, "city": "Lisbon"},
        saga_id="order-1",
    )
    app.sagas.start(
        checkout.CHECKOUT,
        {"sku": "mug", "quantity": 3, "amount": 29.7, "city": "Atlantis"},
        saga_id="order-2",
    )
    app.run_until_idle(timeout=60)
    app.close()


def shoot(board: Dashboard, broker: Broker, out: Path, chromium: str) -> None:
    busiest = max(broker.stats(), key=lambda s: s.dead).subscription
    first_dead = broker.dead_letters.list(limit=1)[0].id
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 760})

        def capture(fragment: str, name: str, ready: str) -> None:
            page.goto(f"{board.url}{fragment}")
            expect(page.get_by_test_id(ready).first).to_be_visible()
            page.wait_for_timeout(300)
            page.screenshot(path=str(out / f"{name}.png"), full_page=True)
            print(out / f"{name}.png")

        capture("#/", "overview", "subscriptions")
        capture(f"#/subscription/{busiest}", "subscription", "throughput-chart")
        capture(f"#/dead/{first_dead}", "dead-letter", "traceback")
        page.goto(f"{board.url}#/dead")
        page.get_by_test_id("select-dead").first.check()
        page.get_by_test_id("replay-selected").click()
        page.get_by_label("Your name").fill("operator")
        page.get_by_label("Why").fill("the address service is fixed")
        page.get_by_test_id("confirm-ok").click()
        expect(page.get_by_test_id("notice")).to_be_visible()
        page.screenshot(path=str(out / "dead-letters.png"), full_page=True)
        print(out / "dead-letters.png")
        capture("#/audit", "audit", "audit")
        capture("#/x/sagas", "sagas", "extension-sagas")
        capture("#/x/schedules", "schedules", "extension-schedules")
        browser.close()


if __name__ == "__main__":
    main()
