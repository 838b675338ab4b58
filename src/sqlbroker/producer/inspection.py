"""What :class:`~sqlbroker.Broker` shows of the queues and the workers: pending copies, the
archive, stats, heartbeats, per-minute series, unrouted publishes and the audit trail."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from sqlbroker.core import validate
from sqlbroker.core.message import (
    ArchivedMessage,
    Outcome,
    PendingMessage,
    State,
    SubscriptionStats,
)
from sqlbroker.core.observability import AuditEntry, SeriesPoint, WorkerInfo
from sqlbroker.core.topics import validate_topic
from sqlbroker.features import metrics
from sqlbroker.features.retention import RetentionDefaults, retention_list
from sqlbroker.storage.backend import Backend


class BrokerInspection:
    """Read-only listings and stats of :class:`~sqlbroker.Broker` (mixed into it)."""

    _retention: RetentionDefaults

    def _checked(self) -> Backend:
        raise NotImplementedError

    def pending(
        self, subscription: str | None = None, *, state: State | str | None = None, limit: int = 100
    ) -> list[PendingMessage]:
        """Copies still in the queue (available, scheduled, blocked or running), oldest first."""
        if subscription is not None:
            validate_topic(subscription, "subscription")
        chosen = None if state is None else validate.member(state, State, "state")
        count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
        return self._checked().message_list(subscription=subscription, state=chosen, limit=count)

    def archive(
        self,
        subscription: str | None = None,
        *,
        outcome: Outcome | str | None = None,
        message_id: str | None = None,
        limit: int = 100,
    ) -> list[ArchivedMessage]:
        """Finished copies, newest first."""
        if subscription is not None:
            validate_topic(subscription, "subscription")
        chosen = None if outcome is None else validate.member(outcome, Outcome, "outcome")
        count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
        canonical = None if message_id is None else validate.message_id(message_id)
        return self._checked().archive_list(
            subscription=subscription, outcome=chosen, message_id=canonical, limit=count
        )

    def stats(self, *, window: float | timedelta = metrics.RATE_WINDOW) -> list[SubscriptionStats]:
        """Per subscription: ready, scheduled, running, blocked, dead, the oldest ready age,
        expired copies, whether flow limits hold claims back now (``throttled``), and — from
        what workers recorded over the last ``window`` seconds —
        completed, retried and dead-lettered per minute and handler time p50/p95."""
        backend = self._checked()
        stats = metrics.subscription_stats(backend, window=window)
        kept = {r.subscription: r for r in retention_list(backend, self._retention)}
        flows = {f.subscription: f for f in backend.flow_list(name=None) if f.limits.limited}
        stats = [
            replace(row, throttled=flow.throttled, throttled_for=flow.throttled_for)
            if (flow := flows.get(row.subscription)) is not None
            else row
            for row in stats
        ]
        return [
            replace(row, archive_retention=kept[name].archive, dead_retention=kept[name].dead)
            if (name := row.subscription) in kept
            else row
            for row in stats
        ]

    # --- observability -----------------------------------------------------------------------

    def workers(self) -> list[WorkerInfo]:
        """Worker processes as their heartbeats last reported them, most recent first."""
        return metrics.workers(self._checked())

    def metrics_series(self, *, minutes: int = 60) -> dict[str, list[SeriesPoint]]:
        """Per subscription, completed / retried / dead and handler p50/p95 for each of the
        last ``minutes`` minutes (the current one last)."""
        return metrics.series(self._checked(), minutes=minutes)

    def unrouted(self, *, window: float | timedelta = metrics.RATE_WINDOW) -> metrics.Unrouted:
        """Publishes that matched no subscription: in the archive, and within ``window``."""
        return metrics.unrouted(self._checked(), window=window)

    def audit(self, *, limit: int = 100, before_id: int | None = None) -> list[AuditEntry]:
        """Replays and purges of dead letters (who, when, which, why), newest first."""
        count = validate.integer(limit, "limit", minimum=1, maximum=validate.MAX_BATCH)
        if before_id is not None:
            before_id = validate.integer(before_id, "before_id", minimum=1, maximum=2**63 - 1)
        return self._checked().audit_list(limit=count, before_id=before_id)
