"""The README is executed: every ```python and ```bash/```sh block of README.md and of
docs/*.md runs as written, in a fresh directory, in a subprocess, and what it claims is
checked (a handler ran, a dead letter was replayed, a saga ended ``completed``, the CLI's
exit codes). Issue 23: from now on the README cannot drift.

How a block runs
----------------
- Every runnable block must match exactly one :class:`Case` below (by its file and a
  distinctive piece of its text); a new block without a case fails
  :func:`test_every_block_has_a_case`, so adding an example means deciding how it is checked.
- A block that cannot run as written is marked in the Markdown itself with an HTML comment on
  the line before its fence, ``<!-- not-run: why -->`` (invisible on GitHub). Use it rarely:
  for a placeholder server (``postgresql://app@db/app``), a command that installs packages or
  is the test suite itself. :func:`test_not_run_blocks_are_rare_and_say_why` keeps count.
- Blocks of docs/outbox.md that open with ``# runs on:`` are complete programs that
  tests/test_docs_outbox.py already runs on the backends they name, and docs/security.md's
  "Setting it up" is run by tests/security/test_docs_setup.py in a cluster of its own;
  they are left to those tests. Blocks of docs/django.md that open with ``# file: PATH``
  are the files of its Django project: the cases of that document write them, as printed,
  into the project their blocks run in.
- **Python blocks** run as ``python snippet.py``, where ``snippet.py`` is the case's
  *prelude*, then the block exactly as printed, then the case's *epilogue*. The prelude
  supplies what the surrounding prose assumes and the block does not define: a ``broker`` on
  ``$SQLBROKER_URL`` and stub functions such as ``charge_card`` (a block that defines a name
  itself overrides the prelude's). The epilogue asserts what the block claims (a failed
  assert is a non-zero exit and its traceback is shown).
- **Shell blocks** run line by line with ``bash``, like a reader typing them into one
  terminal: ``export`` lines carry over, ``sqlbroker`` and ``.venv/bin/…`` are this
  interpreter's environment. A line the case names as long-running (a worker, the
  dashboard, ``stats --watch``) is started in the background, waited for until it answers,
  and interrupted (Ctrl-C) when the block ends; every other line must exit 0 unless the case
  names another code.
- *seed* prepares the database before the block and *verify* checks it afterwards, both in
  this process through the public API. A block that needs a worker, an ``app.py`` for
  ``sqlbroker worker app:broker`` or PostgreSQL gets it from the case, never by editing the
  block. ``$SQLBROKER_URL`` points at a fresh SQLite file or a fresh PostgreSQL database:
  blocks that do not name their own database run on both backends.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import sqlbroker

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = ("python", "bash", "sh")
NOT_RUN = re.compile(r"^<!-- not-run: (?P<why>.+?) -->$")
MAX_NOT_RUN = 16
WAIT = 90.0
SPARK_PATIENCE = 4.0


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str
    not_run: str | None
    heading: str = ""

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks() -> list[Block]:
    """Every ```python / ```bash / ```sh block of the documents, in order."""
    found = []
    for path in DOCUMENTS:
        lines = path.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            fence = re.match(r"^```(\w+)\s*$", lines[index])
            if fence is None:
                index += 1
                continue
            end = lines.index("```", index + 1)
            if fence.group(1) in RUNNABLE:
                before = next((ln for ln in reversed(lines[:index]) if ln.strip()), "")
                marked = NOT_RUN.match(before.strip())
                heading = next(
                    (ln for ln in reversed(lines[:index]) if ln.startswith("#") and " " in ln), ""
                )
                found.append(
                    Block(
                        path,
                        index + 1,
                        fence.group(1),
                        "\n".join(lines[index + 1 : end]) + "\n",
                        marked.group("why") if marked else None,
                        heading,
                    )
                )
            index = end + 1
    return found


def _delegated(block: Block) -> bool:
    """Blocks another test already runs as written: docs/outbox.md's complete programs
    (tests/test_docs_outbox.py) and docs/security.md's least-privilege setup, which needs a
    cluster of its own with the documented role names (tests/security/test_docs_setup.py)."""
    if block.path.name == "outbox.md":
        return block.code.startswith("# runs on:")
    if block.path.name == "django.md":
        return block.code.startswith("# file: ")
    return block.path.name == "security.md" and block.heading.startswith("### Setting it up")


# --- what the cases share ---------------------------------------------------------------------

BROKER_FROM_ENV = """\
import os
from sqlbroker import Broker
broker = Broker(os.environ["SQLBROKER_URL"], migrate=True)
"""


@dataclass(frozen=True)
class Background:
    """A long-running line: started, waited for until ``ready(run)`` holds, interrupted at
    the end of the block; it must then exit with one of ``codes``."""

    ready: Callable[[Run], bool]
    codes: tuple[int, ...] = (0, 130)


@dataclass(frozen=True)
class Case:
    document: str
    contains: str
    backends: tuple[str, ...] = ("sqlite", "postgresql")
    prelude: str = ""
    epilogue: str = ""
    seed: Callable[[Run], None] | None = None
    verify: Callable[[Run], None] | None = None
    background: dict[str, Background] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    stop_when: Callable[[Run], bool] | None = None
    """For a Python block that runs until stopped (``broker.run()``): interrupt it once
    this holds."""
    stopped_codes: tuple[int, ...] = (0,)
    worker: bool = False
    """Run ``sqlbroker worker app:broker`` (the case's ``app.py``) beside the block."""
    marks: tuple[Any, ...] = ()
    patience: float = 1.0
    """How many times the usual waits this block may take: a Spark block starts a JVM and
    Python workers, which on a loaded machine takes minutes (the README stream block: 70 s
    for the SparkSession and 60 s for the first micro-batch at a load average of 12 on 2
    cores), however correct it is."""

    def matches(self, block: Block) -> bool:
        return block.path.relative_to(REPO).as_posix() == self.document and (
            self.contains in block.code
        )


@dataclass
class Run:
    """One block's run: its directory, its database and what it printed."""

    directory: Path
    url: str
    backend: str
    output: str = ""
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def broker(self) -> sqlbroker.Broker:
        return sqlbroker.Broker(self.url)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SQLBROKER_")}
        env.update(
            SQLBROKER_URL=self.url,
            NO_COLOR="1",
            COLUMNS="120",
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            PYSPARK_PYTHON=sys.executable,
        )
        return env


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _wait(condition: Callable[[], bool], what: str, patience: float = 1.0) -> None:
    deadline = time.monotonic() + WAIT * patience
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)


def _count(run: Run, subscription: str, outcome: str = "completed") -> int:
    with run.broker() as broker:
        return len(broker.archive(subscription, outcome=outcome, limit=1000))


def _dead_letter(broker: sqlbroker.Broker, queue: str, payload: Any, reason: str) -> int:
    broker.send(queue, payload)
    (delivery,) = broker.claim(queue, limit=1)
    broker.dead_letter(delivery, reason=reason)
    return max(d.id for d in broker.dead_letters.list(subscription=queue))


# --- README.md --------------------------------------------------------------------------------


def _tour_handled(run: Run) -> bool:
    path = run.directory / "app.db"
    if not path.exists():
        return False
    try:
        with sqlbroker.Broker(f"sqlite:///{path}", migrate=False) as broker:
            billed = broker.archive("billing", outcome="completed")
            return len(billed) == 1 and len(broker.archive("emails", outcome="completed")) == 1
    except sqlbroker.SqlbrokerError:  # the block has not created its schema yet
        return False


def _verify_tour(run: Run) -> None:
    with sqlbroker.Broker(f"sqlite:///{run.directory / 'app.db'}") as broker:
        emails = broker.archive("emails", outcome="completed")
        assert [m.topic for m in emails] == ["emails"], "ada's email was handled"
        assert [m.state.value for m in broker.pending("emails")] == ["scheduled"], "bob's waits"
        assert len(broker.archive("billing", outcome="completed")) == 1


def _seed_two_dead_letters(run: Run) -> None:
    with run.broker() as broker:
        _dead_letter(broker, "emails", {"to": "nobody"}, "invalid address")
        _dead_letter(broker, "emails", {"to": "ada@example.com"}, "the SMTP relay was down")


def _verify_replayed_and_purged(run: Run) -> None:
    with run.broker() as broker:
        assert broker.dead_letters.list() == [], "one replayed, the invalid address purged"
        (replayed,) = broker.claim("emails", limit=5)
        assert replayed.payload == {"to": "ada@example.com"}
        assert {entry.action for entry in broker.audit()} == {"dead.replay", "dead.purge"}
    assert "invalid address" in run.output


APP_PY = """\
import os

from sqlbroker import Broker

broker = Broker(os.environ["SQLBROKER_URL"])
handled = []


@broker.subscriber(queue="emails")
def send_email(msg):
    handled.append(msg.payload)
"""


def _seed_seven_dead_letters(run: Run) -> None:
    with sqlbroker.Broker(f"sqlite:///{run.directory / 'app.db'}") as broker:
        for number in range(7):
            _dead_letter(broker, "emails", {"n": number}, "relay down")


def _workers_alive(run: Run) -> bool:
    with sqlbroker.Broker(f"sqlite:///{run.directory / 'app.db'}") as broker:
        return len(broker.workers()) >= 2


def _verify_cli_tour(run: Run) -> None:
    with sqlbroker.Broker(f"sqlite:///{run.directory / 'app.db'}") as broker:
        assert broker.dead_letters.list(subscription="emails") == [], "all seven replayed"
        replays = [entry for entry in broker.audit() if entry.action == "dead.replay"]
        assert [entry.detail.get("note") for entry in replays] == ["relay fixed"]
        assert len(broker.archive(None, outcome="unrouted")) == 1


def _seed_old_archive(run: Run) -> None:
    """Forty days of age on five completed messages, so that ``--older-than 30d`` has
    something to export (and then delete)."""
    from datetime import UTC, datetime, timedelta

    clock = sqlbroker.ManualClock(datetime.now(UTC) - timedelta(days=40))
    with sqlbroker.Broker(run.url, clock=clock) as broker:
        broker.subscribe("billing", ["orders.#"])
        broker.publish_many([{"topic": "orders.created", "payload": {"n": n}} for n in range(5)])
        broker.complete(broker.claim("billing", limit=5))


def _verify_export_report(run: Run) -> None:
    assert (run.directory / "report" / "report.html").exists()
    assert any((run.directory / "export").rglob("*.parquet")), "the old archive was exported"
    with run.broker() as broker:
        assert broker.archive("billing") == [], "and deleted once verified"


def _seed_billing(run: Run) -> None:
    with sqlbroker.Broker(f"sqlite:///{run.directory / 'app.db'}") as broker:
        broker.subscribe("billing", ["orders.#"])
        broker.publish_many([{"topic": "orders.created", "payload": {"n": n}} for n in range(5)])


def _parquet_written(run: Run) -> bool:
    return any((run.directory / "billing-parquet").glob("*.parquet"))


SAGA_STUBS = """\
from sqlbroker import Saga, Step

def pay(amount, idempotency_key):
    return f"pay-{idempotency_key}"

def refund_payment(payment):
    raise AssertionError("nothing fails: nothing is refunded")
"""

CASES = [
    Case(
        "README.md",
        'broker = Broker("sqlite:///app.db")',
        backends=("sqlite",),
        stop_when=_tour_handled,
        verify=_verify_tour,
    ),
    Case(
        "README.md",
        'for delivery in broker.claim("emails", limit=10, lease=30):',
        prelude=BROKER_FROM_ENV
        + """\
broker.send_many("emails", [{"to": "ada@example.com"}, {"to": None}, {"to": "bob@example.com"}])
handled = []

def handle(payload):
    if payload["to"] is None:
        raise ValueError("no address")
    handled.append(payload["to"])
""",
        epilogue="""
assert handled == ["ada@example.com", "bob@example.com"]
(retried,) = broker.pending("emails")
assert retried.state.value == "scheduled" and retried.attempts == 1
assert "no address" in retried.last_error
assert len(broker.archive("emails", outcome="completed")) == 2
""",
    ),
    Case(
        "README.md",
        'broker.publish("orders.created", {"order": 42}, conn=db)',
        backends=("sqlite",),
        prelude="""\
import sqlite3
from sqlbroker import Broker
broker = Broker("sqlite:///app.db")
db = sqlite3.connect("app.db")
db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total REAL)")
db.execute("CREATE TABLE IF NOT EXISTS ledger (order_id INTEGER)")
db.commit()
charged = []

def charge_card(payload):
    charged.append(payload["order"])
""",
        epilogue="""
broker.run_until_idle(timeout=30)
assert charged == [42], charged
assert db.execute("SELECT count(*) FROM ledger").fetchone()[0] == 1
""",
    ),
    Case(
        "README.md",
        'for dead in broker.dead_letters.list(subscription="emails"):',
        prelude=BROKER_FROM_ENV,
        seed=_seed_two_dead_letters,
        verify=_verify_replayed_and_purged,
    ),
    Case(
        "README.md",
        'broker.schedule("nightly", "reports.nightly"',
        prelude=BROKER_FROM_ENV,
        epilogue="""
assert sorted(s.name for s in broker.schedules()) == ["heartbeat", "nightly"]
(nightly,) = [s for s in broker.schedules() if s.name == "nightly"]
assert nightly.next_run_at.astimezone().hour >= 0 and nightly.tz == "Europe/Paris"
""",
    ),
    Case(
        "README.md",
        'CHECKOUT = Saga("checkout"',
        prelude=BROKER_FROM_ENV + SAGA_STUBS,
        epilogue="""
broker.run_until_idle(timeout=30)
saga = broker.sagas.get("order-1")
assert saga.status.value == "completed", (saga.status, saga.error)
""",
    ),
    Case(
        "README.md",
        "export SQLBROKER_URL=sqlite:///app.db",
        backends=("sqlite",),
        files={"app.py": APP_PY},
        seed=_seed_seven_dead_letters,
        background={
            "sqlbroker stats --watch": Background(lambda run: "oldest ready" in run.output),
            "sqlbroker worker app:broker --concurrency 16 --metrics-port 9464": Background(
                lambda run: _http_ok("http://127.0.0.1:9464/metrics")
            ),
            "sqlbroker dashboard": Background(lambda run: _http_ok("http://127.0.0.1:8765/")),
            "sqlbroker worker app:broker --concurrency 16\n": Background(_workers_alive),
        },
        verify=_verify_cli_tour,
    ),
    Case(
        "README.md",
        "sqlbroker pipeline export --out ./export --older-than 30d",
        marks=(pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(SPARK_PATIENCE * 400)),
        patience=SPARK_PATIENCE,
        seed=_seed_old_archive,
        verify=_verify_export_report,
    ),
    Case(
        "README.md",
        'spark.readStream.format("sqlbroker")',
        backends=("sqlite",),
        marks=(pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(SPARK_PATIENCE * 400)),
        patience=SPARK_PATIENCE,
        seed=_seed_billing,
        stop_when=_parquet_written,
        stopped_codes=(0, 1, 130, -2),
    ),
]


# --- docs/*.md ----------------------------------------------------------------------------------

DJANGO_MANAGE_PY = """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""


def _django_project(run: Run) -> None:
    """docs/django.md's project: its ``# file:`` blocks as printed, and what
    ``django-admin startproject`` and ``startapp`` would have made around them."""
    files = {"manage.py": DJANGO_MANAGE_PY, "mysite/__init__.py": "", "shop/__init__.py": ""}
    for block in blocks():
        if block.path.name == "django.md" and block.code.startswith("# file: "):
            files[block.code.split("\n", 1)[0].removeprefix("# file: ").strip()] = block.code
    for name, text in files.items():
        (run.directory / name).parent.mkdir(parents=True, exist_ok=True)
        (run.directory / name).write_text(text, encoding="utf-8")


def _django_migrated(run: Run) -> None:
    _django_project(run)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input"],
        cwd=run.directory,
        env=run.env(),
        check=True,
        capture_output=True,
    )


def _seed_subscription(run: Run) -> None:
    with run.broker() as broker:
        broker.subscribe("billing", ["orders.#"])
        broker.publish("orders.created", {"order": 1})


def _seed_schedules(run: Run) -> None:
    with run.broker() as broker:
        broker.schedule("billing", "billing.hourly", {}, every=3600)
        broker.schedule("heartbeat", "ops.heartbeat", {}, every=30)


def _verify_schedules_cli(run: Run) -> None:
    with run.broker() as broker:
        assert [s.name for s in broker.schedules()] == ["billing"]
        assert not broker.schedules()[0].paused
    assert '"name": "heartbeat"' in run.output


def _checkout_done(run: Run) -> bool:
    path = run.directory / "sqlbroker.db"
    try:
        with sqlbroker.Broker(f"sqlite:///{path}", migrate=False) as broker:
            return broker.sagas.get("order-1").status.value == "completed"
    except sqlbroker.SqlbrokerError:
        return False


def _verify_checkout(run: Run) -> None:
    import sqlite3

    with contextlib.closing(sqlite3.connect(run.directory / "sqlbroker.db")) as db:
        assert db.execute("SELECT available FROM stock").fetchone() == (8,)
    assert "charged 19.8 for order-1" in run.output


def _seed_tenant_roles(run: Run) -> None:
    import psycopg

    with psycopg.connect(run.url, autocommit=True) as admin:
        for role in ("acme_app", "globex_app"):
            exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            if exists.fetchone() is None:
                admin.execute(f"CREATE ROLE {role} LOGIN")


def _verify_tenants(run: Run) -> None:
    assert "acme" in run.output
    assert "globex" in run.output


def _verify_results_cli(run: Run) -> None:
    assert "outcome:      completed" in run.output, run.output
    assert "is unknown" in run.output
    assert "not a message id" in run.output


CASES += [
    Case(
        "docs/results.md",
        'message_id = broker.send("invoices", {"lines": [19.8, 5.2]})',
        backends=("sqlite",),
        epilogue="""
assert result.outcome == "completed"
assert result.value == {"total": 25.0, "count": 2}
""",
    ),
    Case(
        "docs/flow-control.md",
        'broker.pause("emails", note="SMTP provider down")',
        prelude=BROKER_FROM_ENV,
        epilogue="""
assert broker.archive("reports")[0].outcome == "cancelled"
assert [e.action for e in broker.audit(limit=3)] == [
    "message.cancel",
    "subscription.resume",
    "subscription.pause",
]
assert broker.stats()[0].paused is False
""",
    ),
    Case(
        "docs/flow-control.md",
        'broker.set_flow("payments", max_running=4, rate_limit="100/min")',
        prelude=BROKER_FROM_ENV,
        epilogue="""
from sqlbroker import FlowLimits
(payments,) = broker.flow("payments")
assert payments.limits == FlowLimits(max_running=4, key_concurrency=2, fair=True)
assert broker.subscribers["reports"].flow.max_running == 2
""",
    ),
    Case(
        "docs/results.md",
        "sqlbroker result not-a-message-id",
        worker=True,
        exit_codes={
            "sqlbroker result 01936b8e-0000-7000-8000-000000000000 --json": 1,
            "sqlbroker result not-a-message-id": 2,
        },
        verify=_verify_results_cli,
    ),
    Case(
        "README.md",
        "result = broker.result(order_id, wait=30)",
        prelude=BROKER_FROM_ENV,
        epilogue="""
assert result is not None and result.value == {"total": 25.0}
""",
    ),
]


# docs/flow-control.md, "Debounce and replace" (session 16)
CASES += [
    Case(
        "docs/flow-control.md",
        'key="doc-7", replace=True)',
        prelude=BROKER_FROM_ENV,
        epilogue="""
from sqlbroker import State
pending = {m.key: m.state for m in broker.pending("search-index")}
assert pending == {"doc-7": State.AVAILABLE, "doc-8": State.SCHEDULED}
(rev,) = broker.claim("search-index", limit=10)
assert rev.payload == {"doc": 7, "rev": 2}
""",
    ),
]


CASES += [
    Case(
        "docs/observability.md",
        "for s in broker.stats():",
        prelude=BROKER_FROM_ENV,
        seed=_seed_subscription,
        epilogue="""
assert [s.subscription for s in broker.stats()] == ["billing"]
""",
        verify=lambda run: None if "billing 1" in run.output else pytest.fail(run.output),
    ),
    Case(
        "docs/observability.md",
        "sqlbroker healthcheck --probe liveness",
        worker=True,
    ),
    Case(
        "docs/observability.md",
        "otel.instrument(broker)",
        prelude=BROKER_FROM_ENV,
        epilogue="""
broker.send("emails", {"to": "ada@example.com"})
assert len(broker.pending("emails")) == 1
""",
    ),
    Case(
        "docs/outbox.md",
        "def record_payment(msg):",
        backends=("sqlite",),
        prelude=BROKER_FROM_ENV
        + """with broker.backend.begin() as setup:
    setup.connection.execute("CREATE TABLE ledger (order_id INTEGER, amount REAL)")
""",
        epilogue="""
broker.send("payments", {"order": 42, "amount": 19.8})
broker.run_until_idle(timeout=30)
with broker.backend.begin() as check:
    rows = check.connection.execute("SELECT order_id, amount FROM ledger").fetchall()
    assert [tuple(row) for row in rows] == [(42, 19.8)]
assert len(broker.archive("payments", outcome="completed")) == 1
""",
    ),
    Case(
        "docs/outbox.md",
        'with broker.once("charge", msg.payload["order"]) as first:',
        prelude=BROKER_FROM_ENV
        + """class payments:
    charged = []

    @classmethod
    def charge(cls, order, idempotency_key):
        cls.charged.append((order, idempotency_key))

class msg:  # the handler's message
    payload = {"order": 42}
""",
        epilogue="""
assert payments.charged == [(42, 42)]
with broker.once("charge", 42) as again:
    assert not again, "a redelivery does not charge twice"
""",
    ),
    Case(
        "docs/sagas.md",
        ".venv/bin/python examples/checkout_saga.py",
        backends=("sqlite",),
        verify=lambda run: (
            None
            if "checkout: order-1=completed order-2=compensated" in run.output
            else pytest.fail(run.output)
        ),
    ),
    Case(
        "docs/sagas.md",
        "def reserve(ctx: StepContext) -> dict:",
        backends=("sqlite",),
        prelude="""import sqlite3

with sqlite3.connect("sqlbroker.db") as shop:
    shop.execute("CREATE TABLE stock (sku TEXT PRIMARY KEY, available INTEGER)")
    shop.execute("INSERT INTO stock VALUES ('mug', 10)")

class payments:
    @staticmethod
    def charge(amount, idempotency_key):
        print(f"charged {amount} for {idempotency_key}", flush=True)

    @staticmethod
    def refund(payment):
        raise AssertionError("nothing fails, so nothing is refunded")

class couriers:
    @staticmethod
    def book(city):
        return f"parcel to {city}"
""",
        stop_when=_checkout_done,
        verify=_verify_checkout,
    ),
    Case(
        "docs/schedules.md",
        'broker.send("emails", {"to": "ada@example.com"}, delay=60)',
        prelude=BROKER_FROM_ENV + "from datetime import UTC, datetime\n",
        epilogue="""
(email,) = broker.pending("emails")
assert email.state.value == "scheduled"
assert [m.topic for m in broker.archive(None, outcome="unrouted")] == ["reports.due"]
""",
    ),
    Case(
        "docs/schedules.md",
        'broker.schedule("nightly-report", "reports.nightly"',
        prelude=BROKER_FROM_ENV,
        epilogue="""
assert sorted(s.name for s in broker.schedules()) == ["billing", "heartbeat", "nightly-report"]
""",
    ),
    Case(
        "docs/schedules.md",
        'broker.pause_schedule("billing")',
        prelude=BROKER_FROM_ENV,
        seed=_seed_schedules,
        epilogue="""
assert [(s.name, s.paused) for s in broker.schedules()] == [("billing", False)]
""",
    ),
    Case(
        "docs/schedules.md",
        "sqlbroker schedules pause billing",
        seed=_seed_schedules,
        verify=_verify_schedules_cli,
    ),
    Case(
        "docs/security.md",
        "sqlbroker tenants add acme   --role acme_app",
        backends=("postgresql",),
        seed=_seed_tenant_roles,
        verify=_verify_tenants,
    ),
    Case(
        "docs/django.md",
        "python manage.py sqlbroker_worker",
        backends=("sqlite",),
        seed=_django_project,
        background={
            "python manage.py sqlbroker_worker\n": Background(
                lambda run: "receipt for order 42 sent" in run.output
            )
        },
        marks=(pytest.mark.slow,),
    ),
    Case(
        "docs/django.md",
        "receipt = send_receipt.enqueue(7)",
        backends=("sqlite",),
        seed=_django_migrated,
        prelude="""\
import os
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
""",
        epilogue="""
from sqlbroker.contrib.django_tasks.framework import TaskResultDoesNotExist
try:
    send_receipt.get_result(receipt.id)
except TaskResultDoesNotExist:
    pass
else:
    raise AssertionError("the rolled-back task exists")
from sqlbroker.contrib.django import get_broker
assert get_broker().pending("tasks.emails") == [], "and its message does not either"
""",
        marks=(pytest.mark.slow,),
    ),
    Case(
        "docs/django.md",
        "result = total.enqueue([19.8, 5.2])",
        backends=("sqlite",),
        seed=_django_migrated,
        prelude="""\
import os
import subprocess
import sys
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
worker = subprocess.Popen([sys.executable, "manage.py", "sqlbroker_worker"])
""",
        epilogue="""
worker.terminate()
assert worker.wait(timeout=60) == 0
assert (result.status, result.return_value) == ("SUCCESSFUL", 25.0)
""",
        marks=(pytest.mark.slow,),
    ),
    Case(
        "docs/spark.md",
        "register(spark)                       # once per session",
        backends=("sqlite",),
        marks=(pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(SPARK_PATIENCE * 400)),
        patience=SPARK_PATIENCE,
        epilogue="""
assert spark.read.format("sqlbroker").option("url", "sqlite:///spark.db").load().count() == 0
spark.stop()
""",
    ),
    Case(
        "docs/faststream.md",
        "asyncio.run(app.run())",
        marks=(pytest.mark.slow,),
        stop_when=lambda run: _faststream_receipts(run) == 1,
        verify=lambda run: _check(
            "receipt for order 1" in run.output and _faststream_receipts(run) == 1, run
        ),
    ),
    Case(
        "docs/faststream.md",
        'await broker.publish({"id": 1, "total": 9.5}, "orders", conn=db)',
        backends=("sqlite",),
        epilogue="""
import sqlbroker
with sqlbroker.Broker("sqlite:///shop.db") as check:
    assert len(check.pending("orders")) == 1
assert sqlite3.connect("shop.db").execute("SELECT count(*) FROM orders").fetchone() == (1,)
""",
    ),
    Case(
        "docs/faststream.md",
        "async with TestSqlBroker(broker) as br:",
        backends=("sqlite",),
        epilogue="""
import os
assert not os.path.exists("shop.db")  # the test client ran the handler without a database
""",
    ),
]


def _faststream_receipts(run: Run) -> int:
    try:
        with sqlbroker.Broker(run.url, migrate=False) as broker:
            return len(broker.archive("receipts", outcome="completed"))
    except sqlbroker.SqlbrokerError:  # the app has not created its schema yet
        return 0


def _check(condition: bool, run: Run) -> None:
    assert condition, run.output


# --- docs/celery.md ----------------------------------------------------------------------------


def _printed(document: str, contains: str) -> str:
    """A block of a document as printed, for a case that needs it as a file (``tasks.py``)."""
    (block,) = [b for b in blocks() if b.path == REPO / document and contains in b.code]
    return block.code


CELERY_TASKS = _printed("docs/celery.md", "import sqlbroker.contrib.celery  # registers the")


def _verify_celery_worker(run: Run) -> None:
    assert "scheduled" in run.output, "sqlbroker pending shows the countdown waiting"
    assert "receipt for order 42" in run.output
    with run.broker() as broker:
        assert len(broker.archive("celery", outcome="completed")) == 2, "both acknowledged"
        assert broker.pending("celery") == []


CELERY_MATHS = _printed("docs/celery.md", 'app = Celery("maths"')


def _verify_celery_results(run: Run) -> None:
    assert "\n5\n" in run.output, run.output
    assert "FAILURE ZeroDivisionError('division by zero')" in run.output, run.output


CASES += [
    Case(
        "docs/celery.md",
        "import sqlbroker.contrib.celery  # registers the",
        epilogue="""
send_receipt.delay(42)
from sqlbroker import Broker
with Broker(database) as broker:
    (task,) = broker.pending("celery")
    assert task.state.value == "available"
""",
    ),
    Case(
        "docs/celery.md",
        "celery -A tasks worker --loglevel=INFO",
        files={"tasks.py": CELERY_TASKS},
        background={
            # Celery's own Ctrl-C handler exits 1 after its warm shutdown (EX_FAILURE).
            "celery -A tasks worker": Background(
                ready=lambda run: "receipt for order 43" in run.output, codes=(0, 1)
            )
        },
        verify=_verify_celery_worker,
        marks=(pytest.mark.slow,),
    ),
    Case(
        "docs/celery.md",
        "with publishing_in(db):",
        backends=("postgresql",),
        files={"tasks.py": CELERY_TASKS},
        prelude="""import os, psycopg
with psycopg.connect(os.environ["SQLBROKER_URL"], autocommit=True) as setup:
    setup.execute("CREATE TABLE orders (id integer)")
""",
        epilogue="""
from sqlbroker import Broker
with Broker(os.environ["SQLBROKER_URL"]) as broker:
    (task,) = broker.pending("celery")
    assert task.state.value == "available"
with psycopg.connect(os.environ["SQLBROKER_URL"]) as check:
    assert check.execute("SELECT id FROM orders").fetchall() == [(42,)]
""",
    ),
    Case(
        "docs/celery.md",
        'app = Celery("maths"',
        epilogue="""
from sqlbroker.contrib.celery.results import ResultBackend
assert isinstance(app.backend, ResultBackend)
app.backend.store_result("a-task-id", 5, "SUCCESS")
assert app.AsyncResult("a-task-id").get(timeout=5) == 5
""",
    ),
    Case(
        "docs/celery.md",
        "celery -A maths worker --loglevel=INFO",
        files={"maths.py": CELERY_MATHS},
        background={
            "celery -A maths worker": Background(lambda run: " ready." in run.output, codes=(0, 1))
        },
        verify=_verify_celery_results,
        marks=(pytest.mark.slow,),
    ),
]


# --- collection ---------------------------------------------------------------------------------


def _case_for(block: Block) -> Case | None:
    matching = [case for case in CASES if case.matches(block)]
    assert len(matching) <= 1, f"{block.name} matches {len(matching)} cases"
    return matching[0] if matching else None


def _params() -> Iterator[Any]:
    for block in blocks():
        if block.not_run is not None or _delegated(block):
            continue
        case = _case_for(block)
        if case is None:
            continue  # test_every_block_has_a_case reports it
        for backend in case.backends:
            marks = list(case.marks)
            if backend == "postgresql":
                marks.append(pytest.mark.postgres)
            yield pytest.param(block, case, backend, id=f"{block.name}-{backend}", marks=marks)


def test_every_block_has_a_case() -> None:
    missing = [
        block.name
        for block in blocks()
        if block.not_run is None and not _delegated(block) and _case_for(block) is None
    ]
    assert not missing, (
        f"runnable blocks without a case in tests/test_readme.py: {missing}; add a Case that"
        " checks what the block claims, or mark it <!-- not-run: why --> in the document"
    )
    unused = [
        case.contains
        for case in CASES
        if not any(case.matches(block) and block.not_run is None for block in blocks())
    ]
    assert not unused, f"cases whose block is gone or marked not-run: {unused}"


def test_not_run_blocks_are_rare_and_say_why() -> None:
    skipped = [block for block in blocks() if block.not_run is not None]
    assert len(skipped) <= MAX_NOT_RUN, [block.name for block in skipped]
    assert all(len(block.not_run or "") >= 15 for block in skipped)
    assert sum(1 for block in blocks() if block.not_run is None) >= 2 * len(skipped)


# --- running ------------------------------------------------------------------------------------


@pytest.fixture
def run_for(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Run]:
    def make(backend: str) -> Run:
        directory = tmp_path / "fresh"
        directory.mkdir()
        (directory / ".venv").symlink_to(Path(sys.executable).parent.parent)
        (directory / "examples").symlink_to(REPO / "examples")
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / 'broker.db'}"
        else:
            url = str(request.getfixturevalue("pg_url"))
        return Run(directory, url, backend)

    return make


def _stop(process: subprocess.Popen[str], patience: float = 1.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=WAIT * patience)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"{process.args!r} ignored Ctrl-C") from None
    return int(process.returncode)


def _python(block: Block, case: Case, run: Run) -> None:
    script = run.directory / "snippet.py"
    script.write_text(case.prelude + "\n" + block.code + "\n" + case.epilogue, encoding="utf-8")
    log = run.directory / "snippet.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=run.directory,
            env=run.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            if case.stop_when is None:
                code = process.wait(timeout=WAIT * 2 * case.patience)
                expected: tuple[int, ...] = (0,)
            else:
                stop_when = case.stop_when
                _wait(
                    lambda: stop_when(run) or process.poll() is not None,
                    f"{block.name} to do its work",
                    case.patience,
                )
                assert process.poll() is None, "a long-running block ended by itself"
                code = _stop(process, case.patience)
                expected = case.stopped_codes
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    run.output = log.read_text(encoding="utf-8")
    assert code in expected, f"{block.name} exited {code}:\n{run.output}"


def _commands(code: str) -> Iterator[str]:
    for line in code.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            yield line


def _shell(block: Block, case: Case, run: Run) -> None:
    env = run.env()
    background: list[tuple[str, subprocess.Popen[str], Background]] = []
    try:
        for number, line in enumerate(_commands(block.code)):
            exported = re.match(r"^export (\w+)=(\S+)", line)
            if exported:
                env[exported.group(1)] = exported.group(2).strip("'\"")
                continue
            long_running = next(
                (bg for prefix, bg in case.background.items() if (line + "\n").startswith(prefix)),
                None,
            )
            with (run.directory / f"line{number}.log").open("w") as out:
                process = subprocess.Popen(
                    ["bash", "-c", f"exec {line}"],
                    cwd=run.directory,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            if long_running is None:
                code = process.wait(timeout=WAIT * 3 * case.patience)
                said = (run.directory / f"line{number}.log").read_text(encoding="utf-8")
                run.output += said
                expected = case.exit_codes.get(line.split("#")[0].strip(), 0)
                assert code == expected, f"`{line}` exited {code}, not {expected}:\n{said}"
                continue
            background.append((line, process, long_running))
            log_path = run.directory / f"line{number}.log"

            def ready(
                check: Background = long_running,
                path: Path = log_path,
                proc: subprocess.Popen[str] = process,
            ) -> bool:
                run.output = path.read_text(encoding="utf-8")
                return proc.poll() is not None or check.ready(run)

            _wait(ready, f"`{line}` to answer", case.patience)
            assert process.poll() is None, f"`{line}` ended:\n{log_path.read_text()}"
    finally:
        for line, process, long_running in reversed(background):
            code = _stop(process, case.patience)
            assert code in long_running.codes, f"`{line}` exited {code} when interrupted"
    run.output = "".join(
        path.read_text(encoding="utf-8") for path in sorted(run.directory.glob("line*.log"))
    )


@pytest.mark.parametrize(("block", "case", "backend"), list(_params()))
def test_block_runs_as_written(
    block: Block, case: Case, backend: str, run_for: Callable[[str], Run]
) -> None:
    run = run_for(backend)
    for name, text in case.files.items():
        (run.directory / name).write_text(text, encoding="utf-8")
    if case.seed is not None:
        case.seed(run)
    with _worker_beside(run) if case.worker else contextlib.nullcontext():
        if block.language == "python":
            _python(block, case, run)
        else:
            _shell(block, case, run)
    if case.verify is not None:
        case.verify(run)


@contextlib.contextmanager
def _worker_beside(run: Run) -> Iterator[None]:
    """A worker process for the block, started by the test and stopped after it."""
    (run.directory / "app.py").write_text(APP_PY, encoding="utf-8")
    with (run.directory / "worker.log").open("w") as out:
        worker = subprocess.Popen(
            [str(Path(sys.executable).with_name("sqlbroker")), "worker", "app:broker"],
            cwd=run.directory,
            env=run.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:

        def alive() -> bool:
            assert worker.poll() is None, (run.directory / "worker.log").read_text()
            with run.broker() as broker:
                return bool(broker.workers())

        _wait(alive, "the worker's first heartbeat")
        yield
    finally:
        assert _stop(worker) in (0, 130)


# --- the install line and the two commands (items 5 and 15) ------------------------------------


def test_the_install_line_covers_the_tour() -> None:
    """The tour's install line names the extras its parts need, each one that exists."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (line,) = re.findall(r"pip install -e '\.\[([a-z,]+)\]'", readme)
    named = set(line.split(","))
    assert named <= set(extras)
    needs = {"postgres"}
    if "cron=" in readme:
        needs.add("cron")
    if "--metrics-port" in readme or "sqlbroker metrics" in readme:
        needs.add("metrics")
    assert needs <= named, f"the tour needs {sorted(needs)}, the install line has {line}"
    for extra in re.findall(r"sqlbroker\[(\w+)\]", readme):
        assert extra in extras, extra


def _make_dry_run(target: str, venv: Path) -> list[str]:
    done = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if "pip" in line and " install" in line]


def test_make_demo_installs_only_what_the_demo_needs(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    demo = _make_dry_run("demo", tmp_path / ".venv")
    assert demo, "make demo installs sqlbroker"
    assert all(line.rstrip().endswith("install -e .") for line in demo), demo
    full = _make_dry_run("env", tmp_path / ".venv")
    assert any("dev" in line and "spark" in line for line in full), full
