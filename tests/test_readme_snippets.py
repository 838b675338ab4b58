"""The README's outbox and saga snippets do what they say when run as printed (the names
they take from the surrounding tour — ``broker``, ``db``, ``charge_card`` — are given
here, and the outbox's elided SQL is filled in): the order reaches its handler, the
checkout saga completes."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import sqlbroker

README = Path(__file__).resolve().parent.parent / "README.md"


def _block(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(f"### {heading}\n") :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, heading
    return found.group(1)


def test_the_outbox_snippet_delivers_the_order_to_its_handler(tmp_path: Path) -> None:
    code = _block("Outbox and exactly-once effects")
    code = code.replace('"INSERT INTO orders …"', '"INSERT INTO orders (id) VALUES (42)"')
    code = code.replace(
        '"INSERT INTO ledger …"', '"INSERT INTO ledger (id) VALUES (?)", (msg.payload["order"],)'
    )
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE orders (id INTEGER); CREATE TABLE ledger (id INTEGER);")
    charged: list[Any] = []
    with sqlbroker.Broker(f"sqlite:///{path}") as broker:
        exec(code, {"broker": broker, "db": db, "charge_card": charged.append})
        broker.run_until_idle(timeout=30)
        assert broker.archive(outcome="unrouted") == []
    assert charged == [{"order": 42}]
    assert db.execute("SELECT id FROM ledger").fetchall() == [(42,)]
    db.close()


def test_the_saga_snippet_completes_the_checkout(tmp_path: Path) -> None:
    with sqlbroker.Broker(f"sqlite:///{tmp_path}/app.db") as broker:
        exec(_block("Sagas"), {"broker": broker})
        assert broker.sagas.get("order-1").status is sqlbroker.SagaStatus.COMPLETED
