"""``sqlbroker saga``: list sagas and show one with its steps."""

from __future__ import annotations

import click
from rich.json import JSON
from rich.table import Table
from rich.text import Text

from sqlbroker.core.sagas import SagaStatus
from sqlbroker.interfaces.cli.params import json_option
from sqlbroker.interfaces.cli.render import (
    cell,
    console,
    echo_json,
    human_time,
    print_damaged,
    print_table,
    table,
)
from sqlbroker.interfaces.cli.session import Session, pass_session


@click.group("saga")
def saga() -> None:
    """List sagas and show one with its steps."""


@saga.command("list")
@click.option("--name", default=None, help="Only sagas of this definition.")
@click.option(
    "--status",
    type=click.Choice([status.value for status in SagaStatus]),
    default=None,
    help="Only sagas in this status.",
)
@click.option("--limit", type=int, default=100, show_default=True)
@json_option()
@pass_session
def list_sagas(
    session: Session, name: str | None, status: str | None, limit: int, as_json: bool
) -> None:
    """List sagas, newest first."""
    rows = session.broker().sagas.list(name=name, status=status, limit=limit)
    if as_json:
        echo_json(rows)
        return
    columns = ["id", "saga", "status", "step", "error", "created", "finished"]
    body = [
        (
            s.id,
            s.name,
            s.status.value,
            s.step,
            s.error,
            human_time(s.created_at),
            human_time(s.finished_at),
        )
        for s in rows
    ]
    print_table(table(None, columns, body, numeric=["step"]), empty="no sagas")
    print_damaged(rows)


@saga.command("show")
@click.argument("saga_id", metavar="ID")
@json_option("Print the saga and its steps as JSON.")
@pass_session
def show_saga(session: Session, saga_id: str, as_json: bool) -> None:
    """Show one saga: its state, data and every step."""
    found = session.broker().sagas.get(saga_id)
    if as_json:
        echo_json(found)
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, value in [
        ("id", found.id),
        ("saga", found.name),
        ("status", found.status.value),
        ("error", found.error),
        ("waiting for", found.message_id),
        ("created", human_time(found.created_at)),
        ("updated", human_time(found.updated_at)),
        ("deadline", human_time(found.deadline)),
        ("finished", human_time(found.finished_at)),
    ]:
        grid.add_row(label, cell(value))
    out = console()
    out.print(grid)
    out.print(Text("\ndata", style="bold"))
    out.print(JSON.from_data(found.data, indent=2, ensure_ascii=False))
    columns = ["#", "step", "status", "attempts", "error", "finished", "compensated"]
    body = [
        (
            step.index,
            step.name + ("" if step.compensate else " (no undo)"),
            step.status.value,
            step.attempts,
            step.error,
            human_time(step.finished_at),
            human_time(step.compensated_at),
        )
        for step in found.steps
    ]
    out.print(Text(""))
    print_table(table("steps", columns, body, numeric=["#", "attempts"]), empty="no steps")
