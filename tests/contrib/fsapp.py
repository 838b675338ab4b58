"""The FastStream application the process tests run as ``faststream run fsapp:app``.

Configured by environment: ``FSAPP_URL`` (the database), ``FSAPP_EFFECTS`` (a JSON-lines
file each handler appends its events to), ``FSAPP_LEASE`` (seconds). An order's payload
steers its handler: ``hang`` seconds of sleep on its first attempt (the kill test's stuck
message); a payload that fails ``Order``'s validation is dead-lettered.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

from faststream import Context, FastStream
from pydantic import BaseModel

from sqlbroker.contrib.faststream import SqlBroker, SqlMessage

broker = SqlBroker(
    os.environ["FSAPP_URL"],
    lease=float(os.environ.get("FSAPP_LEASE", "30")),
    reap_interval=0.2,
    poll_interval=0.2,
    graceful_timeout=5,
)
app = FastStream(broker)


class Order(BaseModel):
    id: str
    qty: int
    hang: float = 0.0


def record(event: str, **fields: object) -> None:
    line = json.dumps({"event": event, "pid": os.getpid(), **fields})
    with open(os.environ["FSAPP_EFFECTS"], "a") as effects:
        effects.write(line + "\n")


@broker.subscriber("orders", max_workers=4)
@broker.publisher("orders.done")
async def handle(order: Order, message: Annotated[SqlMessage, Context()]) -> dict[str, object]:
    record("start", id=order.id, attempt=message.attempt)
    if order.hang and message.attempt == 1:
        await asyncio.sleep(order.hang)
    record("finish", id=order.id, attempt=message.attempt)
    return {"id": order.id, "qty": order.qty}


@broker.subscriber("orders.done", group="audit")
async def audit(done: dict[str, object]) -> None:
    record("audit", id=done["id"])


@app.after_startup
async def ready() -> None:
    record("ready")
