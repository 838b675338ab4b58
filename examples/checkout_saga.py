"""A checkout saga on the embedded SQLite default: reserve stock → charge card → book
shipping, with release and refund as compensations.

    .venv/bin/python examples/checkout_saga.py [--db PATH]

Two orders go through. The first completes. The second is for an address no courier
serves: booking the shipping is rejected, so the saga turns back — the card is refunded
and then the stock released, in reverse order — and ends ``compensated``.

Each action returns JSON that later steps and the compensations see (``ctx.outputs``).
Stock lives in the broker's own database and is changed through ``ctx.conn`` in the
transaction that records the step (``transactional=True``): exactly once. The card is an
outside system: its calls are guarded by ``broker.once`` so that a redelivered step does
not charge or refund twice. The last line is for scripts:
``checkout: <saga id>=<status> …``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import sqlbroker
from sqlbroker import Reject, Saga, Step, StepContext

CHECKOUT = Saga(
    "checkout",
    [Step("reserve"), Step("charge"), Step("ship", compensate=False)],
    timeout=300,
)
SERVED = {"Berlin", "Lisbon", "Oslo"}

payments: list[str] = []


def make_broker(url: str) -> sqlbroker.Broker:
    app = sqlbroker.Broker(url)

    @app.saga_step(CHECKOUT, "reserve", transactional=True)
    def reserve(ctx: StepContext) -> dict[str, Any]:
        sku, quantity = ctx.data["sku"], ctx.data["quantity"]
        ctx.conn.execute(
            "UPDATE stock SET available = available - ? WHERE sku = ?", (quantity, sku)
        )
        return {"reserved": quantity}

    @app.saga_compensation(CHECKOUT, "reserve", transactional=True)
    def release(ctx: StepContext) -> None:
        quantity = ctx.outputs["reserve"]["reserved"]
        ctx.conn.execute(
            "UPDATE stock SET available = available + ? WHERE sku = ?",
            (quantity, ctx.data["sku"]),
        )

    @app.saga_step(CHECKOUT, "charge")
    def charge(ctx: StepContext) -> dict[str, Any]:
        with app.once("checkout.charge", ctx.saga_id) as first:
            if first:
                payments.append(f"charge {ctx.data['amount']:.2f} for {ctx.saga_id}")
        return {"payment": f"pay-{ctx.saga_id}"}

    @app.saga_compensation(CHECKOUT, "charge")
    def refund(ctx: StepContext) -> None:
        with app.once("checkout.refund", ctx.saga_id) as first:
            if first:
                payments.append(f"refund {ctx.outputs['charge']['payment']}")

    @app.saga_step(CHECKOUT, "ship")
    def ship(ctx: StepContext) -> dict[str, Any]:
        if ctx.data["city"] not in SERVED:
            raise Reject(f"no courier serves {ctx.data['city']}")
        return {"tracking": f"TRK-{ctx.saga_id}"}

    return app


def stock(app: sqlbroker.Broker) -> int:
    with app.backend.begin() as tx:
        row = tx.connection.execute("SELECT available FROM stock WHERE sku = 'mug'").fetchone()
        return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="SQLite file (default: a temporary one)")
    args = parser.parse_args()
    path = Path(args.db or os.path.join(tempfile.mkdtemp(), "checkout.db"))
    path.unlink(missing_ok=True)
    app = make_broker(f"sqlite:///{path}")
    with app.backend.begin() as tx:
        tx.connection.execute("CREATE TABLE stock (sku TEXT PRIMARY KEY, available INTEGER)")
        tx.connection.execute("INSERT INTO stock VALUES ('mug', 10)")
    orders = {
        "order-1": {"sku": "mug", "quantity": 2, "amount": 19.80, "city": "Lisbon"},
        "order-2": {"sku": "mug", "quantity": 3, "amount": 29.70, "city": "Atlantis"},
    }
    for saga_id, data in orders.items():
        app.sagas.start(CHECKOUT, data, saga_id=saga_id)
    app.run_until_idle(timeout=60)
    for line in payments:
        print(f"payments: {line}")
    results = []
    for saga_id in orders:
        saga = app.sagas.get(saga_id)
        steps = ", ".join(f"{step.name}={step.status.value}" for step in saga.steps)
        print(f"{saga_id}: {saga.status.value} ({steps}){' - ' + saga.error if saga.error else ''}")
        results.append(f"{saga_id}={saga.status.value}")
    print(f"stock of mugs: {stock(app)} (10 - 2 shipped)")
    print(f"inspect: sqlbroker --url sqlite:///{path} saga list")
    print("checkout: " + " ".join(results))
    app.close()


if __name__ == "__main__":
    main()
