"""The checker: sorts a scenario's messages from the histories and the database's final state.

The database is read with plain SQL through the drivers (not through sqlbroker's API), so the
verdict does not depend on the code under test. A scenario is clean when:

- **lost** = 0: every message whose publish returned ``ok`` ended, in every subscription
  expected to get it, completed, dead-lettered, expired or cancelled;
- **unexpected** = 0: nothing exists (in the database or delivered) that no producer tried
  to publish, or whose every publish definitely failed;
- **foreign errors** = 0: no caller saw an exception that is not a sqlbroker error;
- every **duplicate** delivery (a message handled more than once) is explained: the earlier
  attempt's worker was killed or paused, its handler failed (an explicit retry or a
  timeout), the server was restarted or its connection terminated while it ran, or its
  lease expired, shown by the database's times: the next claim came after that lease's end.
  On PostgreSQL a restart may also forget a claim made just before it (claims do not wait
  for the WAL flush): the next delivery then repeats the attempt number, and the forgotten
  claim's time lies within ``CLAIM_FORGOTTEN`` seconds of a restart (or a failover: a
  claim's commit does not wait for the standby either).
  A refused ack (``settle_lost``) is no explanation by itself: the lease it lost needs one
  of those causes, or two leases were valid at once. Unexplained ones are reported;
- **double completions** = 0: no delivery's ``complete`` committed twice, and no tag has
  two messages in one subscription (idempotent publish);
- **overlaps** = 0: no attempt committed its outcome after another attempt of the same
  copy had started (two valid leases at once);
- **order**: per ordering key, completions follow publish order.

**Recovered** counts messages whose publish was ambiguous but which exist: not a fault.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from reliability.history import Event

TERMINAL = {"completed", "dead", "expired", "cancelled"}

FINAL_SQL = (
    "SELECT message_id, subscription, outcome, payload, content_type FROM sqlbroker_archive"
    " UNION ALL SELECT message_id, subscription, 'dead', payload, content_type"
    " FROM sqlbroker_dead"
    " UNION ALL SELECT message_id, subscription, 'pending:' || state, payload, content_type"
    " FROM sqlbroker_message"
)


@dataclass(frozen=True)
class FinalRow:
    message_id: str
    subscription: str | None
    state: str
    tag: str | None


def final_rows(url: str) -> list[FinalRow]:
    """Every copy the database holds, in whichever table it ended."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1].split("?", 1)[0]
        conn = sqlite3.connect(path)
        try:
            rows = conn.execute(FINAL_SQL).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as pg:
            rows = pg.execute(FINAL_SQL).fetchall()
    result = []
    for message_id, subscription, state, payload, content_type in rows:
        tag = None
        if content_type == "application/json":
            value = json.loads(bytes(payload))
            tag = value.get("tag") if isinstance(value, dict) else None
        result.append(FinalRow(str(message_id), subscription, state, tag))
    return result


@dataclass
class Verdict:
    published: int = 0
    completed: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    foreign_errors: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    duplicates: Counter[str] = field(default_factory=Counter)
    unexplained: list[str] = field(default_factory=list)
    double_completions: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    torn_lines: int = 0

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or self.unexpected
            or self.foreign_errors
            or self.unexplained
            or self.double_completions
            or self.overlaps
            or self.order
        )

    def summary(self) -> str:
        def some(items: list[str]) -> str:
            return f"{len(items)} {items[:5]}" if items else "0"

        return (
            f"published={self.published} completed={self.completed}"
            f" lost={some(self.lost)} unexpected={some(self.unexpected)}"
            f" foreign_errors={some(self.foreign_errors)} recovered={len(self.recovered)}"
            f" duplicates={dict(self.duplicates)} unexplained={some(self.unexplained)}"
            f" double_completions={some(self.double_completions)}"
            f" overlaps={some(self.overlaps)} order={some(self.order)}"
            f" torn_lines={self.torn_lines}"
        )

    def assert_clean(self) -> None:
        assert self.clean, self.summary()


# How far (s) a claim the restart forgot may lie from the restart's record: the WAL
# writer flushes an unflushed commit within 0.6 s; the rest is slack for a busy machine.
CLAIM_FORGOTTEN = 2.0


@dataclass
class ServerFaults:
    """Monotonic times of every fault of the server or of the network to it (target
    ``"network"``: a fault proxy's silence or resets); wall times of its restarts."""

    moments: list[float] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)


def _faults(events: Iterable[Event]) -> tuple[dict[int, list[tuple[str, float]]], ServerFaults]:
    by_pid: dict[int, list[tuple[str, float]]] = defaultdict(list)
    server = ServerFaults()
    for event in events:
        if event["op"] != "fault":
            continue
        if event["target"] in ("server", "network"):
            server.moments.append(event["mono"])
            if event["kind"] in ("restart", "failover"):
                server.restarts.append(event["wall"])
        elif event["target"] == "disk":
            # A full disk explains no duplicate by itself: an ack it refused is written
            # once space is back, or its lease expires first ("lease expired").
            continue
        else:
            by_pid[int(event["target"])].append((event["kind"], event["mono"]))
    return by_pid, server


def check(
    events: list[Event],
    rows: list[FinalRow],
    *,
    subscriptions: Collection[str],
    lease: float | None = None,
) -> Verdict:
    """Judge one scenario. ``subscriptions`` are those every published message must reach,
    unless its publish names its own (``subs``). ``lease`` is the lease (seconds) every claim
    of the scenario took; without it no redelivery is put down to an expired lease."""
    verdict = Verdict(torn_lines=sum(1 for event in events if event["op"] == "torn"))
    attempts: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event["op"] == "publish":
            attempts[event["tag"]].append(event)
            if event["status"] == "foreign":
                verdict.foreign_errors.append(f"{event['tag']}: {event.get('error')}")

    rows_by_tag: dict[str | None, list[FinalRow]] = defaultdict(list)
    for row in rows:
        rows_by_tag[row.tag].append(row)

    # Lost, unexpected, recovered, duplicate publishes.
    for tag, tried in attempts.items():
        statuses = {event["status"] for event in tried}
        expected = next((e["subs"] for e in tried if e.get("subs")), None) or subscriptions
        held = [row for row in rows_by_tag.get(tag, []) if row.subscription in expected]
        if "ok" in statuses:
            verdict.published += 1
            for subscription in expected:
                ended = [row for row in held if row.subscription == subscription]
                if not any(row.state in TERMINAL for row in ended):
                    states = sorted(row.state for row in ended) or ["missing"]
                    verdict.lost.append(f"{tag}@{subscription}: {'/'.join(states)}")
        elif held and statuses <= {"failed"}:
            verdict.unexpected.append(f"{tag}: exists though every publish failed")
        elif held:
            verdict.recovered.append(tag)
        per_subscription = Counter(row.subscription for row in held)
        for subscription, count in per_subscription.items():
            if count > 1:
                verdict.double_completions.append(f"{tag}@{subscription}: {count} messages")
    for tag, held in rows_by_tag.items():
        if tag not in attempts:
            verdict.unexpected.extend(f"{tag}: {row.message_id} never published" for row in held)
    verdict.completed = sum(1 for row in rows if row.state == "completed")

    # Deliveries, per copy (message id and subscription).
    kills, server_faults = _faults(events)
    copies: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for event in events:
        if event["op"] in {"deliver", "handled", "settled", "settle_lost"}:
            copies[(event["id"], event["sub"])].append(event)
    for (message_id, subscription), trail in copies.items():
        deliveries = [event for event in trail if event["op"] == "deliver"]
        tag = deliveries[0]["tag"] if deliveries else None
        if tag is not None and tag not in attempts:
            verdict.unexpected.append(f"{tag}: delivered but never published")
        completes = [e for e in trail if e["op"] == "settled" and e["kind"] == "complete"]
        if len({event["delivery"] for event in completes}) > 1 or len(completes) > 1:
            verdict.double_completions.append(f"{message_id}@{subscription}: completed twice")
        # One lease per claim: a forgotten claim's attempt number comes again.
        by_lease: dict[str, list[Event]] = defaultdict(list)
        for event in trail:
            by_lease[event["token"]].append(event)
        # Claim order is attempt order: a worker paused between its claim and its handler's
        # start begins a stale attempt after the newer one it lost the lease to.
        starts = sorted(deliveries, key=lambda event: (event["attempt"], event["mono"]))
        for index, start in enumerate(starts):
            mine = by_lease[start["token"]]
            handled = next((e for e in mine if e["op"] == "handled"), None)
            settled = next((e for e in mine if e["op"] == "settled"), None)
            later = starts[index + 1 :]
            if settled is not None and handled is not None:
                for other in later:
                    if other["mono"] < handled["mono"]:
                        verdict.overlaps.append(
                            f"{message_id}@{subscription}: attempt {other['attempt']} started"
                            f" while attempt {start['attempt']} ran, which then settled"
                        )
            if not later:
                continue
            reason = _explain(start, mine, later[0], kills, server_faults, lease)
            if reason is None:
                verdict.unexplained.append(
                    f"{message_id}@{subscription}: attempt {start['attempt']} (pid"
                    f" {start['pid']}) redelivered as attempt {later[0]['attempt']}"
                )
            else:
                verdict.duplicates[reason] += 1

    # Per-key order: the completing deliveries of one key follow the keys' publish order.
    seq_of: dict[str, tuple[str, int]] = {}
    for tag, tried in attempts.items():
        for event in tried:
            if event.get("key") is not None:
                seq_of[tag] = (event["key"], int(event["seq"]))
    done: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for trail in copies.values():
        completes = [e for e in trail if e["op"] == "settled" and e["kind"] == "complete"]
        starts = {e["attempt"]: e for e in trail if e["op"] == "deliver"}
        for event in completes:
            start = starts.get(event["attempt"])
            if start is None or start["tag"] not in seq_of:
                continue
            key, seq = seq_of[start["tag"]]
            done[f"{key}@{event['sub']}"].append((start["mono"], seq, start["tag"]))
    for key, finished in done.items():
        finished.sort()
        seqs = [seq for _, seq, _ in finished]
        if seqs != sorted(seqs):
            verdict.order.append(f"{key}: completed in order {seqs}")
    return verdict


def _explain(
    start: Event,
    mine: list[Event],
    following: Event,
    kills: dict[int, list[tuple[str, float]]],
    server_faults: ServerFaults,
    lease: float | None,
) -> str | None:
    """Why the copy was delivered again after ``start``; ``None`` when nothing explains it.

    An expired lease is shown on the database's clock: the next claim's time (its lease's
    end less the lease) is at or after the end of the earlier lease as its claim set it.
    Heartbeats only move that end later, so a claim before it found the lease still valid.
    """
    window = (start["mono"], following["mono"])
    cause = _process_fault(kills.get(int(start["pid"]), []), start["mono"], following["mono"])
    if cause is not None:
        return cause
    if any(e["op"] == "settled" and e["kind"] == "retry" for e in mine):
        return "explicit retry"
    if any(e["op"] == "handled" and e.get("error") for e in mine):
        return "handler failed"
    if any(window[0] <= moment <= window[1] for moment in server_faults.moments):
        return "connection lost"
    if following["attempt"] == start["attempt"]:
        # The database did not count the claim: a restart forgot it. The claim was before
        # its handler started (on the database's clock, from its lease when known).
        claimed = start["wall"] if lease is None else float(start["leased_until"]) - lease
        if any(abs(claimed - restart) <= CLAIM_FORGOTTEN for restart in server_faults.restarts):
            return "claim forgotten by a restart"
    if lease is not None and float(following["leased_until"]) - lease >= float(
        start["leased_until"]
    ):
        return "lease expired"
    return None


ENDINGS = {"kill": "worker killed", "exit": "worker exited"}


def _process_fault(faults: list[tuple[str, float]], started: float, following: float) -> str | None:
    """The fault of the worker that ran an attempt starting at ``started`` which explains
    the next attempt starting at ``following``, if any.

    A process ends at a ``kill`` (or its own ``exit``), so one recorded before the next
    attempt began explains it, even when recorded a moment before ``started``: the fault is
    recorded just before the signal is sent, and a handler may start in between. A pause
    (``stop`` until the next ``cont``) explains it when it overlaps the attempts' span; the
    newer attempt may even have started first, when the worker was paused between its
    claim and the start of its handler.
    """
    low, high = min(started, following), max(started, following)
    paused_at: float | None = None
    for kind, moment in faults:
        if kind in ENDINGS and moment <= following:
            return ENDINGS[kind]
        if kind == "stop":
            paused_at = moment if paused_at is None else paused_at
        elif kind == "cont" and paused_at is not None:
            if paused_at <= high and moment >= low:
                return "worker paused"
            paused_at = None
        elif kind not in {"stop", "cont"} and low <= moment <= high:
            return kind
    if paused_at is not None and paused_at <= high:
        return "worker paused"
    return None


def verdict_for(
    events: list[Event], url: str, *, subscriptions: Collection[str], **options: Any
) -> Verdict:
    """``check`` against the database's final state."""
    return check(events, final_rows(url), subscriptions=subscriptions, **options)
