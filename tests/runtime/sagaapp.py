"""A checkout saga for the runtime tests, in process or as ``python -m runtime.sagaapp``.

Three steps — reserve, charge, ship — each with a compensation. Every action and
compensation is transactional: it inserts ``(saga_id, step, kind, pid)`` into the table
``saga_effects`` through ``ctx.conn``, in the transaction that records the step, so the
table shows exactly what took effect. The saga's data steers it: ``fail`` names the step
whose action rejects, ``undo_fail`` the step whose compensation always raises, ``sleep``
the seconds each function takes (inside its transaction).

Environment for the process: ``SQLBROKER_URL`` (required), ``SQLBROKER_READY`` (a file
created once the worker runs), ``SQLBROKER_LEASE``, ``SQLBROKER_REAP_INTERVAL``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import sqlbroker
from sqlbroker import Saga, Step, StepContext

CHECKOUT = Saga("checkout", [Step("reserve"), Step("charge"), Step("ship")], timeout=600)
TABLE = (
    "CREATE TABLE IF NOT EXISTS saga_effects"
    " (seq {serial}, saga_id text, step text, kind text, pid integer)"
)


def create_table(url: str) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(TABLE.format(serial="INTEGER PRIMARY KEY AUTOINCREMENT"))
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLE.format(serial="bigserial PRIMARY KEY"))


def read_effects(url: str) -> list[tuple[str, str, str]]:
    """``(saga_id, step, kind)`` in the order they committed."""
    query = "SELECT saga_id, step, kind FROM saga_effects ORDER BY seq"
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return [tuple(row) for row in conn.execute(query)]  # type: ignore[misc]
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(row) for row in conn.execute(query)]  # type: ignore[misc]


def build(url: str, *, undo_attempts: int = 3, **options: Any) -> sqlbroker.Broker:
    """The checkout saga's app; compensations retry fast, ``undo_attempts`` times at most."""
    broker = sqlbroker.Broker(url, migrate=True, **options)
    mark = "?" if url.startswith("sqlite") else "%s"
    insert = f"INSERT INTO saga_effects (saga_id, step, kind, pid) VALUES ({mark}, {mark}, {mark}, {mark})"  # noqa: E501

    def record(ctx: StepContext, kind: str) -> None:
        time.sleep(float(ctx.data.get("sleep", 0)))
        ctx.conn.execute(insert, (ctx.saga_id, ctx.step, kind, os.getpid()))

    def action(ctx: StepContext) -> dict[str, Any]:
        if ctx.data.get("fail") == ctx.step:
            raise sqlbroker.Reject(f"{ctx.step} refused")
        record(ctx, "do")
        return {"step": ctx.step, "after": sorted(ctx.outputs)}

    def compensation(ctx: StepContext) -> None:
        if ctx.data.get("undo_fail") == ctx.step:
            raise RuntimeError(f"cannot undo {ctx.step}")
        record(ctx, "undo")

    fast = sqlbroker.RetryPolicy(base=0.01, cap=0.05, max_attempts=undo_attempts)
    for step in CHECKOUT.steps:
        broker.saga_step(CHECKOUT, step.name, transactional=True, concurrency=4)(action)
        broker.saga_compensation(
            CHECKOUT, step.name, transactional=True, concurrency=4, retry=fast
        )(compensation)
    return broker


class _Ready(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self._path = path

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("worker %s running"):
            Path(self._path).touch()


def main() -> int:
    url = os.environ["SQLBROKER_URL"]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if os.environ.get("SQLBROKER_READY"):
        logger = logging.getLogger("sqlbroker")
        logger.setLevel(logging.INFO)
        logger.addHandler(_Ready(os.environ["SQLBROKER_READY"]))
    # A killed worker charges an attempt to every copy it held (prefetched ones too), so
    # under a kill loop compensations need more than the in-process tests' three.
    broker = build(
        url,
        lease=float(os.environ.get("SQLBROKER_LEASE", "2")),
        max_attempts=100,
        undo_attempts=int(os.environ.get("SQLBROKER_UNDO_ATTEMPTS", "100")),
    )
    broker.run(reap_interval=float(os.environ.get("SQLBROKER_REAP_INTERVAL", "0.5")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
