"""``sqlbroker saga``: list sagas and show one with its steps."""

from __future__ import annotations

import click
from rich.text import Text

from sqlbroker.core.sagas import SagaStatus
from sqlbroker.interfaces.cli.params import json_option
from sqlbroker.interfaces.cli.render import (
    console,
    echo_json,
    fields,
    human_time,
    json_view,
    listing,
)
from sqlbroker.interfaces.cli.session import Session, pass_session


@click.group("saga")
def saga() -> None:
    """List sagas and show one with its steps."""


@saga.command("list")
@click.option("--name", help="Only sagas of this definition.")
@click.option(
    "--status",
    type=click.Choice([status.value for status in SagaStatus]),
    help="Only sagas in this status.",
)
@click.option("--limit", type=int, default=100)
@json_option()
@pass_session
def list_sagas(
    session: Session, name: str | None, status: str | None, limit: int, as_json: bool
) -> None:
    """List sagas, newest first."""
    listing(
        session.reader().sagas.list(name=name, status=status, limit=limit),
        {
            "id": lambda s: s.id,
            "saga": lambda s: s.name,
            "status": lambda s: s.status.value,
            "step": lambda s: s.step,
            "error": lambda s: s.error,
            "created": lambda s: human_time(s.created_at),
            "finished": lambda s: human_time(s.finished_at),
        },
        as_json=as_json,
        empty="no sagas",
        numeric=["step"],
        key="id",
        drop=["created", "step", "finished"],
    )


@saga.command("show")
@click.argument("saga_id", metavar="ID")
@json_option("Print the saga and its steps as JSON.")
@pass_session
def show_saga(session: Session, saga_id: str, as_json: bool) -> None:
    """Show one saga: its state, data and every step."""
    found = session.reader().sagas.get(saga_id)
    if as_json:
        echo_json(found)
        return
    out = console()
    out.print(
        fields(
            [
                ("id", found.id),
                ("saga", found.name),
                ("status", found.status.value),
                ("error", found.error),
                ("waiting for", found.message_id),
                ("created", human_time(found.created_at)),
                ("updated", human_time(found.updated_at)),
                ("deadline", human_time(found.deadline)),
                ("finished", human_time(found.finished_at)),
            ]
        )
    )
    out.print(Text("\ndata", style="bold"))
    out.print(json_view(found.data))
    out.print(Text(""))
    listing(
        found.steps,
        {
            "#": lambda step: step.index,
            "step": lambda step: step.name + ("" if step.compensate else " (no undo)"),
            "status": lambda step: step.status.value,
            "attempts": lambda step: step.attempts,
            "error": lambda step: step.error,
            "finished": lambda step: human_time(step.finished_at),
            "compensated": lambda step: human_time(step.compensated_at),
        },
        as_json=False,
        empty="no steps",
        title="steps",
        damaged=None,
        numeric=["#", "attempts"],
    )
