"""Operations commands: ``sqlbroker metrics`` (Prometheus), ``sqlbroker healthcheck``
(liveness and readiness probes), and the worker's ``--metrics-port`` and ``--log-format``."""

from __future__ import annotations

import socket
import threading
from dataclasses import asdict, dataclass

import click

from sqlbroker.app import Broker
from sqlbroker.core import observability as facts
from sqlbroker.core.errors import SchemaError, SqlbrokerError
from sqlbroker.interfaces import logs, prometheus
from sqlbroker.interfaces.cli.params import DURATION, PORT, POSITIVE_DURATION, json_option, options
from sqlbroker.interfaces.cli.render import echo_json, print_table, table
from sqlbroker.interfaces.cli.session import Session, listening, pass_session

EXIT_NOT_LIVE = 1
EXIT_NOT_READY = 3
DEFAULT_MAX_LAG = 300.0


observe_options = options(
    click.option(
        "--log-format",
        type=click.Choice(logs.LOG_FORMATS, case_sensitive=False),
        default="plain",
        help="json: one JSON object per line with the records' structured fields.",
    ),
    click.option(
        "--metrics-port",
        type=PORT,
        metavar="PORT",
        help="Serve Prometheus metrics on this port (needs the metrics extra).",
    ),
    click.option(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="Address the metrics endpoint listens on (0.0.0.0 for every interface).",
    ),
)
"""The worker's ``--log-format``, ``--metrics-port`` and ``--metrics-host`` options."""


def serve_worker_metrics(broker: Broker, *, port: int, host: str) -> None:
    """Serve the database metrics plus this process's handler metrics on ``host:port``."""
    registry = prometheus.registry_for(broker)
    broker.add_observer(prometheus.HandlerMetrics(registry))
    with listening(host, port):
        prometheus.serve(registry, port=port, host=host)
    click.echo(f"metrics on http://{host}:{port}/metrics", err=True)


@click.command()
@click.option("--port", type=PORT, default=prometheus.DEFAULT_PORT)
@click.option(
    "--host",
    default="127.0.0.1",
    help="Address to listen on (0.0.0.0 for every interface).",
)
@click.option("--once", is_flag=True, help="Print one scrape on stdout and exit.")
@click.option(
    "--window",
    type=DURATION,
    default=facts.RATE_WINDOW,
    metavar="SECONDS",
    help="Window of the recent handler-time quantiles.",
)
@pass_session
def metrics(session: Session, port: int, host: str, once: bool, window: float) -> None:
    """Serve Prometheus metrics computed from the database at scrape time.

    Queue gauges per subscription (ready, scheduled, running, blocked, dead letters,
    oldest ready age), outcome counters (sqlbroker_messages_total), recent handler-time
    quantiles, expired and unrouted messages, and live workers. Runs until Ctrl-C.
    """
    registry = prometheus.registry_for(session.reader(), window=window)
    if once:
        click.echo(prometheus.exposition(registry).decode(), nl=False)
        return
    with listening(host, port):
        prometheus.serve(registry, port=port, host=host)
    click.echo(f"serving http://{host}:{port}/metrics (Ctrl-C to stop)", err=True)
    threading.Event().wait()


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    live: bool
    """A failed live check means "restart me"; a failed ready check "send no traffic"."""


def _checks(
    broker: Broker,
    *,
    probe: str,
    max_heartbeat_age: float,
    max_lag: float,
    this_host: bool,
    subscriptions: tuple[str, ...],
) -> list[Check]:
    checks: list[Check] = []
    try:
        version = broker.schema_version()
    except SqlbrokerError as error:
        return [Check("database", False, str(error), live=True)]
    checks.append(Check("database", True, f"reachable, schema version {version}", live=True))
    if probe == "readiness":
        try:
            broker.backend.check_schema()
            checks.append(Check("schema", True, "current", live=False))
        except SchemaError as error:
            checks.append(Check("schema", False, str(error), live=False))
            return checks
    try:
        workers = broker.workers()
    except SqlbrokerError as error:
        checks.append(Check("heartbeat", False, str(error), live=True))
        return checks
    host = socket.gethostname()
    mine = [w for w in workers if not this_host or w.host == host]
    fresh = facts.alive(mine, max_age=max_heartbeat_age)
    where = f" on {host}" if this_host else ""
    if fresh:
        detail = f"{len(fresh)} worker(s){where} seen in the last {max_heartbeat_age:g} s"
    else:
        last = min((w.seen_age for w in mine if w.stopped_at is None), default=None)
        detail = f"no worker{where} seen in the last {max_heartbeat_age:g} s" + (
            f" (the freshest {last:.0f} s ago)" if last is not None else ""
        )
    checks.append(Check("heartbeat", bool(fresh), detail, live=True))
    if probe == "readiness":
        every = broker.stats()
        stats = [s for s in every if not subscriptions or s.subscription in subscriptions]
        # A name no subscription has (a typo, or one its worker has not created yet) is not
        # ready, rather than a lag of nothing.
        unknown = sorted(set(subscriptions) - {s.subscription for s in every})
        lagging = [
            s for s in stats if s.oldest_ready_age is not None and s.oldest_ready_age > max_lag
        ]
        if unknown:
            detail = f"no subscription named {', '.join(map(repr, unknown))}"
        elif lagging:
            worst = max(lagging, key=lambda s: s.oldest_ready_age or 0.0)
            detail = (
                f"{len(lagging)} subscription(s) over {max_lag:g} s; worst"
                f" {worst.subscription} at {worst.oldest_ready_age:.0f} s"
            )
        else:
            detail = f"every oldest ready message is under {max_lag:g} s"
        checks.append(Check("lag", not (lagging or unknown), detail, live=False))
    return checks


@click.command()
@click.option(
    "--probe",
    type=click.Choice(["liveness", "readiness"]),
    default="readiness",
    help="liveness: database and heartbeats; readiness: also schema and lag.",
)
@click.option(
    "--max-heartbeat-age",
    type=POSITIVE_DURATION,
    default=prometheus.DEFAULT_HEARTBEAT_AGE,
    metavar="SECONDS",
    help="A worker is alive if its last heartbeat is at most this old.",
)
@click.option(
    "--max-lag",
    type=POSITIVE_DURATION,
    default=DEFAULT_MAX_LAG,
    metavar="SECONDS",
    help="Readiness fails when a ready message is older.",
)
@click.option(
    "--this-host",
    is_flag=True,
    help="Count only workers on this host (a probe inside a worker's container).",
)
@click.option(
    "--subscription",
    "subscriptions",
    multiple=True,
    metavar="NAME",
    help="Check the lag of these subscriptions only (repeatable); one that does not exist"
    " is not ready.",
)
@json_option()
@pass_session
def healthcheck(
    session: Session,
    probe: str,
    max_heartbeat_age: float,
    max_lag: float,
    this_host: bool,
    subscriptions: tuple[str, ...],
    as_json: bool,
) -> None:
    """Check the broker for liveness and readiness probes.

    Checks that the database is reachable, the schema current, a worker heartbeat fresh
    and the consumer lag under --max-lag. Exits 0 when healthy, 1 when not live (database
    unreachable or no fresh heartbeat), 3 when live but not ready (schema or lag), 2 when
    it cannot check (an unusable URL, a refused login, a SQLite file that does not exist).
    """
    checks = _checks(
        session.reader(),
        probe=probe,
        max_heartbeat_age=max_heartbeat_age,
        max_lag=max_lag,
        this_host=this_host,
        subscriptions=subscriptions,
    )
    failed = [check for check in checks if not check.ok]
    not_live = any(check.live for check in failed)
    status = "not live" if not_live else "not ready" if failed else "healthy"
    if as_json:
        echo_json({"status": status, "probe": probe, "checks": [asdict(c) for c in checks]})
    else:
        body = [(c.name, "ok" if c.ok else "FAIL", c.detail) for c in checks]
        print_table(table(f"{status} ({probe})", ["check", "", "detail"], body), empty="")
    if failed:
        raise click.exceptions.Exit(EXIT_NOT_LIVE if not_live else EXIT_NOT_READY)
