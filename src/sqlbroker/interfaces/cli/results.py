"""``sqlbroker result ID``: a message's stored result (docs/results.md)."""

from __future__ import annotations

import click

from sqlbroker.core.results import Result
from sqlbroker.interfaces.cli.params import DURATION, json_option
from sqlbroker.interfaces.cli.render import echo_json, escape_controls, human_time, json_text
from sqlbroker.interfaces.cli.session import CliFailure, Session, pass_session


@click.command()
@click.argument("message_id", metavar="ID")
@click.option(
    "--wait",
    type=DURATION,
    default=0.0,
    show_default=False,
    help="Wait up to this long for the message to finish (30, 2m). [default: no wait]",
)
@click.option(
    "--subscription",
    help="Whose copy: required when the message went to several subscriptions.",
)
@json_option("Print the result as JSON.")
@pass_session
def result(
    session: Session, message_id: str, wait: float, subscription: str | None, as_json: bool
) -> None:
    """Show the result of message ID: the value its handler returned, or the error of a
    dead-lettered copy, or how else it finished.

    Exits 0 with the result, 1 when the message is not finished (after --wait) or unknown,
    2 for bad input (a malformed ID, a negative --wait, a message fanned out to several
    subscriptions without --subscription).
    """
    found = session.reader().result(message_id, wait=wait, subscription=subscription)
    if found is None:
        waited = f" after waiting {wait:g} s" if wait else ""
        raise CliFailure(f"message {message_id} is not finished yet{waited}")
    if as_json:
        echo_json(found)
        return
    _show(found)


def _show(found: Result) -> None:
    lines = [
        ("message", found.message_id),
        ("subscription", found.subscription),
        ("outcome", found.outcome),
        ("finished", human_time(found.finished_at)),
    ]
    if found.outcome == "completed":
        lines.append(("value", json_text(found.value, indent=None)))
    if found.reason is not None:
        lines.append(("reason", found.reason))
    if found.error is not None:
        lines.append(("error", f"{found.error.type}: {found.error.message}"))
    for name, text in lines:
        click.echo(f"{name + ':':<14}{escape_controls(text)}")
