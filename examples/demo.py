"""The sqlbroker demo: a shop's order pipeline on the embedded SQLite default.

    make demo                          # or: .venv/bin/python examples/demo.py [--db PATH]

Two storefronts (EU and US) take about 2,000 orders. Every order becomes

- a job on the ``fulfilment`` queue (point to point), prioritised by shipping speed:
  express = URGENT, priority = HIGH, standard = NORMAL, economy = LOW;
- an ``orders.created.<region>`` event, fanned out to every subscription whose pattern
  matches: ``billing`` (``orders.#``: all of them) and ``analytics`` (``orders.*.eu``).

The handlers behave like real ones: the warehouse and the payment provider time out now
and then (retried with backoff), a few orders are poison (dead-lettered, each for its own
reason), and a flash sale's economy orders hold their price for one second only (a TTL)
while the warehouse is busy with express orders, so some expire unhandled. Fulfilment
also reports low stock on ``inventory.low-stock``, a topic nobody subscribes to yet: those
publishes are archived as ``unrouted`` instead of vanishing.

The database is ``.demo/demo.db`` (or ``--db PATH`` / ``$SQLBROKER_DEMO_DB``), recreated
on every run. The last line is for scripts: ``demo: orders=… copies=… completed=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.logging import RichHandler
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from sqlbroker import HIGH, LOW, NORMAL, URGENT, Broker, Message, Reject, RetryPolicy

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DB = REPO / ".demo" / "demo.db"
DB_ENV = "SQLBROKER_DEMO_DB"

ORDERS_PER_STOREFRONT = 1_000
BATCH = 40
FLASH_SALE_ORDERS = 24
FLASH_SALE_PRICE_HOLD = 1.0  # seconds: the TTL of a flash-sale order
DRAIN_TIMEOUT = 60.0

BILLING_TOPICS = ["orders.#"]
ANALYTICS_TOPICS = ["orders.*.eu"]

SHIPPING = {"express": URGENT, "priority": HIGH, "standard": NORMAL, "economy": LOW}
SHIPPING_MIX = {"express": 5, "priority": 15, "standard": 55, "economy": 25}

log = logging.getLogger("demo")


# --- 1. The shop's world: a catalog, a warehouse and a payment provider --------------------


class Catalog:
    """Eight SKUs and their stock; reports each SKU once when its stock runs low."""

    LOW_STOCK = 120

    def __init__(self) -> None:
        self._stock = {f"SKU-{n}": 260 + 40 * n for n in range(1, 9)}
        self._reported: set[str] = set()
        self._lock = threading.Lock()  # plain-function handlers run in several threads

    def check(self, sku: str) -> None:
        if sku not in self._stock:
            raise ValueError(f"bad sku {sku!r}: not in the catalog")

    def take(self, sku: str) -> int | None:
        """Take one item; return the stock left when it just ran low, else ``None``."""
        with self._lock:
            self._stock[sku] -= 1
            left = self._stock[sku]
            if left >= self.LOW_STOCK or sku in self._reported:
                return None
            self._reported.add(sku)
            return left


def warehouse_reserve(order: dict[str, Any], attempt: int) -> None:
    """A stand-in for the warehouse API: 20–40 ms a call, and now and then a timeout, a
    hiccup that clears by the third attempt. One warehouse never answers."""
    time.sleep(random.uniform(0.02, 0.04))
    if order["warehouse"] == "WH-GHOST":
        raise ConnectionError("warehouse WH-GHOST is not answering")
    if attempt <= 2 and random.random() < 0.05:
        raise ConnectionError("warehouse API timed out")


async def payment_authorise(order: dict[str, Any], attempt: int) -> None:
    """A stand-in for the payment provider: fast, async, and ~3% of first tries time out."""
    await asyncio.sleep(random.uniform(0.002, 0.008))
    if attempt == 1 and random.random() < 0.03:
        raise TimeoutError("payment provider timed out")


# --- 2. The application: a broker and its subscribers ------------------------------------


def build_app(url: str, catalog: Catalog) -> Broker:
    broker = Broker(url)

    # Backoff stays short (50 ms doubling to 0.5 s) so the demo runs in seconds. A ValueError
    # means the order itself is wrong: retrying cannot help, so it goes to the dead letters.
    fulfilment_retry = RetryPolicy(max_attempts=4, base=0.05, cap=0.5, dead_on=(ValueError,))

    @broker.subscriber(queue="fulfilment", concurrency=12, retry=fulfilment_retry)
    def fulfil(msg: Message) -> None:
        """A plain function: runs in the worker's thread pool, never on its event loop."""
        order = msg.payload
        if not order["address"].strip():
            raise Reject("invalid address")
        catalog.check(order["sku"])
        warehouse_reserve(order, msg.attempt)
        left = catalog.take(order["sku"])
        if left is not None:
            broker.publish("inventory.low-stock", {"sku": order["sku"], "left": left})

    @broker.subscriber(
        topics=BILLING_TOPICS, name="billing", concurrency=16, retry=RetryPolicy(base=0.05, cap=0.5)
    )
    async def bill(msg: Message) -> None:
        await payment_authorise(msg.payload, msg.attempt)

    @broker.subscriber(topics=ANALYTICS_TOPICS, name="analytics", concurrency=4)
    async def track(msg: Message) -> None:
        await asyncio.sleep(0.001)

    return broker


# --- 3. The producers: two storefronts publishing in batches -----------------------------


@dataclass
class Published:
    """What the storefronts published, counted per subscription copy (thread-safe)."""

    orders: int = 0
    copies: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, orders: int, copies: Counter[str]) -> None:
        with self._lock:
            self.orders += orders
            self.copies.update(copies)


# Poison orders the storefronts let through: (batch number, field, bad value).
POISON = {
    "eu": [(3, "address", ""), (9, "sku", "SKU-404"), (17, "address", " ")],
    "us": [(5, "warehouse", "WH-GHOST"), (11, "address", ""), (20, "sku", "SKU-404")],
}


def make_order(region: str, number: int, shipping: str) -> dict[str, Any]:
    return {
        "order": f"{region.upper()}-{number:05d}",
        "region": region,
        "shipping": shipping,
        "sku": f"SKU-{random.choices(range(1, 9), weights=range(8, 0, -1))[0]}",
        "address": f"{random.randint(1, 99)} Market Street",
        "warehouse": random.choice(["WH-1", "WH-2"]),
        "amount": round(random.uniform(5, 300), 2),
    }


def place_orders(
    broker: Broker,
    published: Published,
    orders: Sequence[dict[str, Any]],
    *,
    ttl: float | None = None,
) -> None:
    """Queue the fulfilment jobs and publish the ``orders.created.<region>`` events.

    ``send_many`` writes one transaction per call with shared options, so jobs go in one
    call per shipping speed; ``publish_many`` takes per-message options in one call.
    A ``ttl`` applies to the fulfilment jobs: the events (billing authorises the payment,
    analytics counts) stay valid whether or not the order ships.
    """
    for shipping, priority in SHIPPING.items():
        jobs = [order for order in orders if order["shipping"] == shipping]
        broker.send_many("fulfilment", jobs, priority=priority, ttl=ttl)
    broker.publish_many(
        {
            "topic": f"orders.created.{order['region']}",
            "payload": order,
            "priority": SHIPPING[order["shipping"]],
        }
        for order in orders
    )
    eu = sum(order["region"] == "eu" for order in orders)
    published.add(
        len(orders), Counter({"fulfilment": len(orders), "billing": len(orders), "analytics": eu})
    )


def storefront(broker: Broker, region: str, published: Published, stop: threading.Event) -> None:
    shipping_choices, weights = zip(*SHIPPING_MIX.items(), strict=True)
    poison = {batch: (name, value) for batch, name, value in POISON[region]}
    number = 0
    for batch in range(ORDERS_PER_STOREFRONT // BATCH):
        if stop.is_set():
            return
        orders = []
        for _ in range(BATCH):
            number += 1
            orders.append(make_order(region, number, random.choices(shipping_choices, weights)[0]))
        if batch in poison:
            name, value = poison[batch]
            orders[0][name] = value
        place_orders(broker, published, orders)

        if region == "eu" and batch == 12:
            # The flash sale, at the busiest moment: economy orders are LOW priority, so
            # they wait behind the express and standard backlog, and their price hold (the
            # TTL) runs out first. Expired copies are never delivered; the reaper archives
            # them as "expired".
            flash = [make_order(region, 90_000 + n, "economy") for n in range(FLASH_SALE_ORDERS)]
            place_orders(broker, published, flash, ttl=FLASH_SALE_PRICE_HOLD)
        time.sleep(0.05)


# --- 4. Watching it: numbers straight from the broker ------------------------------------


@dataclass
class Row:
    published: int = 0
    completed: int = 0
    retried: int = 0
    dead: int = 0
    expired: int = 0
    queued: int = 0

    @property
    def finished(self) -> int:
        return self.completed + self.dead + self.expired


def snapshot(broker: Broker, published: Published) -> dict[str, Row]:
    """Per subscription: published copies (counted by the producers) and what became of
    them (read from the database: stats, archive and dead letters)."""
    rows = {name: Row(published=count) for name, count in published.copies.items()}
    for stats in broker.stats():
        row = rows.setdefault(stats.subscription, Row())
        row.queued = stats.ready + stats.scheduled + stats.running + stats.blocked
        row.dead = stats.dead
    # The archive is newest first and returns at most 10,000 rows per call: enough here.
    for copy in broker.archive(outcome="completed", limit=10_000):
        assert copy.subscription is not None
        rows[copy.subscription].completed += 1
        rows[copy.subscription].retried += copy.attempts > 1
    for copy in broker.archive(outcome="expired", limit=10_000):
        assert copy.subscription is not None
        rows[copy.subscription].expired += 1
    return rows


def live_view(rows: dict[str, Row], published: Published, elapsed: float) -> Group:
    table = Table(header_style="bold", expand=False)
    for column in ["subscription", "published", "completed", "retried", "dead", "expired"]:
        table.add_column(column, justify="left" if column == "subscription" else "right")
    table.add_column("in queue", justify="right")
    total = Row()
    for name in sorted(rows):
        row = rows[name]
        table.add_row(
            name,
            f"{row.published:,}",
            f"{row.completed:,}",
            f"{row.retried:,}",
            f"{row.dead:,}",
            f"{row.expired:,}",
            f"{row.queued:,}",
        )
        for column in fields(Row):
            setattr(total, column.name, getattr(total, column.name) + getattr(row, column.name))
    copies = max(total.published, 1)
    header = Text.assemble(
        ("sqlbroker demo", "bold"),
        f"  ·  {published.orders:,} orders → {total.published:,} copies  ·  ",
        (f"{total.finished / copies:4.0%} done", "bold green"),
        f"  ·  {elapsed:4.1f} s",
    )
    bar = Table.grid()
    bar.add_row(ProgressBar(total=copies, completed=total.finished, width=72))
    return Group(header, bar, table)


# --- 5. The summary ----------------------------------------------------------------------


def summary_table(
    rows: dict[str, Row], broker: Broker, orders: int
) -> tuple[Table, dict[str, int]]:
    total = {
        "copies": sum(row.published for row in rows.values()),
        "completed": sum(row.completed for row in rows.values()),
        "retried": sum(row.retried for row in rows.values()),
        "dead": sum(row.dead for row in rows.values()),
        "expired": sum(row.expired for row in rows.values()),
        "pending": sum(row.queued for row in rows.values()),
        "unrouted": len(broker.archive(outcome="unrouted", limit=10_000)),
    }
    reasons = Counter(
        (dead.subscription, dead.reason) for dead in broker.dead_letters.list(limit=10_000)
    )
    table = Table(title="What happened", title_justify="left", header_style="bold")
    table.add_column("outcome")
    table.add_column("copies", justify="right")
    table.add_row(f"published ({orders:,} orders, fanned out)", f"{total['copies']:,}")
    table.add_row(Text("completed", style="green"), f"{total['completed']:,}")
    table.add_row("  of which needed more than one attempt", f"{total['retried']:,}")
    table.add_row(Text("dead-lettered", style="red"), f"{total['dead']:,}")
    for (subscription, reason), count in sorted(reasons.items()):
        table.add_row(Text(f"  {subscription}: {reason}", style="dim"), f"{count:,}")
    table.add_row(Text("expired (TTL ran out first)", style="yellow"), f"{total['expired']:,}")
    table.add_row("still in a queue", f"{total['pending']:,}")
    table.add_row(Text("unrouted (no subscription matched)", style="dim"), f"{total['unrouted']:,}")
    return table, total


def shell_path(path: Path) -> str:
    """``path`` relative to the current directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def inspect_commands(url: str, broker: Broker) -> list[str]:
    script = Path(sys.executable).with_name("sqlbroker")
    cli = f"{shell_path(script) if script.exists() else 'sqlbroker'} --url {url}"
    dead = broker.dead_letters.list(limit=1)
    example_id = dead[0].id if dead else 1
    return [
        f"{cli} dlq list",
        f"{cli} dlq show {example_id}",
        f"{cli} dlq replay --all --yes",
        f"{cli} archive --outcome expired",
        f"{cli} stats",
    ]


# --- 6. Running it -----------------------------------------------------------------------


def fresh_database(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{shell_path(path)}"


def in_background(
    target: Callable[[], None], name: str, errors: list[BaseException]
) -> threading.Thread:
    """Start ``target`` in a thread; whatever it raises lands in ``errors``."""

    def run() -> None:
        try:
            target()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def run_shop(broker: Broker, console: Console) -> tuple[Published, dict[str, Row], bool]:
    """Run the worker and the storefronts, watch until every queue is empty, then stop the
    worker gracefully. Returns what was published, the final numbers, and whether it
    finished in time."""
    published = Published()
    errors: list[BaseException] = []
    stop_storefronts = threading.Event()
    started = time.monotonic()
    # The reaper expires TTLs and recovers lost leases. It runs every 0.5 s instead of 5 s
    # so that the expired flash-sale orders show up while we watch.
    worker = in_background(
        lambda: broker.run(reap_interval=0.5, grace=10.0), "sqlbroker-worker", errors
    )
    storefronts = [
        in_background(
            lambda region=region: storefront(broker, region, published, stop_storefronts),
            f"storefront-{region}",
            errors,
        )
        for region in ("eu", "us")
    ]
    drained = False
    # Transient: the live view is replaced by the final one printed by main().
    with Live(console=console, refresh_per_second=8, transient=True) as live:
        try:
            while not errors and time.monotonic() - started < DRAIN_TIMEOUT:
                rows = snapshot(broker, published)
                live.update(live_view(rows, published, time.monotonic() - started))
                producing = any(thread.is_alive() for thread in storefronts)
                if not producing and not sum(row.queued for row in rows.values()):
                    drained = True
                    break
                time.sleep(0.25)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping the worker gracefully…[/]")
            raise
        finally:
            stop_storefronts.set()
            for thread in storefronts:
                thread.join()
            # stop() reaches a worker that is running; repeat it in case ours was still
            # starting (it then finishes its handlers and writes back every outcome).
            while worker.is_alive():
                broker.stop()
                worker.join(timeout=0.5)
    if errors:
        raise errors[0]
    if not drained:
        log.error("gave up waiting after %.0f s", DRAIN_TIMEOUT)
    return published, snapshot(broker, published), drained


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--db",
        type=Path,
        default=Path(os.environ.get(DB_ENV) or DEFAULT_DB),
        help=f"SQLite file to (re)create (default: .demo/demo.db, or ${DB_ENV})",
    )
    args = parser.parse_args(argv)

    console = Console()
    # The worker logs each dead letter as a warning; show them above the live view.
    logging.basicConfig(
        level=logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
    )
    url = fresh_database(args.db)
    started = time.monotonic()
    with build_app(url, Catalog()) as broker:
        # A subscription receives only what is published after it exists. The worker creates
        # its subscriptions as it starts, but the storefronts may be quicker: create them now.
        broker.subscribe("billing", BILLING_TOPICS)
        broker.subscribe("analytics", ANALYTICS_TOPICS)
        try:
            published, rows, drained = run_shop(broker, console)
        except KeyboardInterrupt:
            return 130
        elapsed = time.monotonic() - started
        table, total = summary_table(rows, broker, published.orders)
        console.print(live_view(rows, published, elapsed))
        console.print()
        console.print(table)
        console.print("\nInspect the results (the database stays until the next run):")
        for command in inspect_commands(url, broker):
            console.print(f"  {command}", style="cyan", highlight=False, soft_wrap=True)

    numbers = " ".join(f"{name}={value}" for name, value in total.items())
    print(f"\ndemo: orders={published.orders} {numbers} seconds={elapsed:.1f}")
    accounted = total["completed"] + total["dead"] + total["expired"] + total["pending"]
    if accounted != total["copies"]:
        print(f"demo: {total['copies'] - accounted} copies unaccounted for", file=sys.stderr)
        return 1
    return 0 if drained else 1


if __name__ == "__main__":
    sys.exit(main())
