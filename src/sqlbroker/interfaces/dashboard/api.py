"""What the dashboard's pages read and do, as JSON-ready data.

Every value goes to the browser as JSON and is rendered there as text (never as HTML), so
nothing here escapes anything: the page does it structurally.

Pages for features that live elsewhere (sagas, schedules) plug in as :class:`Extension`
objects: a name, a title and a function returning a :class:`Table`. The dashboard lists
them in its navigation and renders their tables; until one is registered under a name the
page says the feature is not available.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlbroker.app import Broker
from sqlbroker.core import observability as facts
from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption, NotFound
from sqlbroker.core.message import DeadLetter, State
from sqlbroker.core.serde import jsonable, raw_preview

OVERVIEW_MINUTES = 30
SUBSCRIPTION_MINUTES = 60
PENDING_LIMIT = 50
DEAD_PAGE = 100
HEARTBEAT_AGE = 30.0
PLANNED_EXTENSIONS = {"sagas": "Sagas", "schedules": "Schedules"}


@dataclass(frozen=True, slots=True)
class Table:
    """A table an extension page shows: column names and rows of plain values."""

    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Extension:
    """A dashboard page provided by another feature (``name`` is its URL segment)."""

    name: str
    title: str
    load: Callable[[Broker], Table]


@dataclass
class Api:
    broker: Broker
    extensions: dict[str, Extension] = field(default_factory=dict)

    # --- reads -----------------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        broker = self.broker
        stats = broker.stats()
        series = broker.metrics_series(minutes=OVERVIEW_MINUTES)
        workers = broker.workers()
        alive = facts.alive(workers, max_age=HEARTBEAT_AGE)
        unrouted = broker.unrouted()
        return {
            "backend": broker.backend_name,
            "url": broker.url,
            "subscriptions": jsonable(stats),
            "series": {
                name: [point.completed for point in points] for name, points in series.items()
            },
            "dead_series": {
                name: [point.dead for point in points] for name, points in series.items()
            },
            "workers": jsonable(workers),
            "workers_alive": len(alive),
            "alive": [w.name for w in alive],
            "unrouted": jsonable(unrouted),
        }

    def subscription(self, name: str) -> dict[str, Any]:
        broker = self.broker
        stats = [s for s in broker.stats() if s.subscription == name]
        if not stats:
            raise NotFound(f"no subscription named {name!r}")
        series = broker.metrics_series(minutes=SUBSCRIPTION_MINUTES).get(name, [])
        pending = {
            state.value: jsonable(broker.pending(name, state=state, limit=PENDING_LIMIT))
            for state in (State.AVAILABLE, State.SCHEDULED, State.RUNNING, State.BLOCKED)
        }
        return {
            "stats": jsonable(stats[0]),
            "series": jsonable(series),
            "pending": pending,
            "patterns": next(
                (list(s.patterns) for s in broker.subscriptions() if s.name == name), []
            ),
        }

    def dead_letters(self, query: Mapping[str, str]) -> dict[str, Any]:
        after = query.get("after_id") or None
        rows = self.broker.dead_letters.list(
            subscription=query.get("subscription") or None,
            topic=query.get("topic") or None,
            error_type=query.get("error_type") or None,
            reason_contains=query.get("reason_contains") or None,
            limit=DEAD_PAGE,
            after_id=None if after is None else _integer(after, "after_id"),
        )
        return {
            "dead_letters": [_dead_summary(row) for row in rows],
            "audit": jsonable(self.broker.audit(limit=20)),
            "subscriptions": [s.name for s in self.broker.subscriptions()],
        }

    def dead_letter(self, dead_id: str) -> dict[str, Any]:
        dead = self.broker.dead_letters.get(_integer(dead_id, "id"))
        data = jsonable(dead)
        data["payload_text"] = _payload_text(dead)
        return {"dead_letter": data}

    def audit(self) -> dict[str, Any]:
        return {"audit": jsonable(self.broker.audit(limit=100))}

    def extension_list(self) -> list[dict[str, Any]]:
        pages = [
            {"name": name, "title": title, "available": name in self.extensions}
            for name, title in PLANNED_EXTENSIONS.items()
        ]
        pages += [
            {"name": e.name, "title": e.title, "available": True}
            for e in self.extensions.values()
            if e.name not in PLANNED_EXTENSIONS
        ]
        return pages

    def extension(self, name: str) -> dict[str, Any]:
        found = self.extensions.get(name)
        if found is None:
            return {"available": False, "name": name}
        table = found.load(self.broker)
        return {
            "available": True,
            "name": name,
            "title": found.title,
            "columns": list(table.columns),
            "rows": jsonable([list(row) for row in table.rows]),
            "note": table.note,
        }

    # --- actions ---------------------------------------------------------------------------

    def act(self, action: str, body: Mapping[str, Any], actor: str) -> dict[str, Any]:
        ids = body.get("ids")
        if not isinstance(ids, list) or not ids:
            raise InvalidOption("ids", "name one or more dead letters")
        note = body.get("note") or None
        dead = self.broker.dead_letters
        if action == "replay":
            new_ids = dead.replay(ids, actor=actor, note=note)
            return {"replayed": len(new_ids), "delivery_ids": new_ids}
        if action == "purge":
            return {"purged": dead.purge(ids, actor=actor, note=note)}
        raise InvalidOption("action", f"unknown action {action!r}")


def _integer(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidOption(name, f"must be an integer, not {text!r}") from None
    return validate.integer(value, name, minimum=0, maximum=2**63 - 1)


def _payload_text(dead: DeadLetter) -> str:
    if isinstance(dead.payload, bytes | bytearray):
        return raw_preview(dead.payload, dead.content_type)
    return json.dumps(dead.payload, indent=2, ensure_ascii=False)


def _dead_summary(dead: DeadLetter) -> dict[str, Any]:
    return {
        "id": dead.id,
        "subscription": dead.subscription,
        "topic": dead.topic,
        "reason": dead.reason,
        "error_type": dead.error_type,
        "error_message": dead.error_message,
        "attempts": dead.attempts,
        "replay_count": dead.replay_count,
        "dead_at": jsonable(dead.dead_at),
        "damaged": dead.damaged,
    }
