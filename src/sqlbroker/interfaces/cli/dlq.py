"""``sqlbroker dlq``: list, show, replay and purge dead letters.

Replaying or purging by filter or ``--all`` asks for confirmation first, unless ``--yes``
is given; without a terminal to ask on, ``--yes`` is required. Naming dead letters by id
needs no confirmation. Every replay and purge is audited with the actor ``cli:<user>``.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import click
from rich.table import Table
from rich.text import Text

from sqlbroker.core.errors import NotFound
from sqlbroker.core.message import DeadLetter
from sqlbroker.core.serde import JSON_CONTENT_TYPE
from sqlbroker.features.dead_letters import DeadLetters, DeadSelection
from sqlbroker.interfaces.cli.params import json_option, note_option, options
from sqlbroker.interfaces.cli.render import (
    console,
    echo_json,
    fields,
    human_time,
    json_view,
    listing,
    literal,
    payload_preview,
    plural,
    table,
)
from sqlbroker.interfaces.cli.session import (
    CliFailure,
    InvalidUsage,
    Session,
    cli_actor,
    found_in,
    pass_session,
)

CONFIRM_PREVIEW = 1000
"""How many matching dead letters are counted before asking; more shows as "more than"."""
_PAST = {"replay": "replayed", "purge": "purged"}

filter_options = options(
    click.option("--subscription", help="Only dead letters of this subscription."),
    click.option("--topic", help="Only dead letters of this topic."),
    click.option("--error-type", help="Only this exception type (e.g. ValueError)."),
    click.option(
        "--reason",
        "reason_contains",
        metavar="TEXT",
        help="Only reasons containing TEXT.",
    ),
)
"""The selection options every ``dlq`` command shares."""


def _given(options: dict[str, str | None]) -> DeadSelection:
    """The filters given on the command line, as keyword arguments of ``broker.dead_letters``."""
    return cast(DeadSelection, {k: v for k, v in options.items() if v is not None})


def stdin_is_terminal() -> bool:
    """Whether a confirmation prompt can be answered (stdin is a terminal)."""
    return sys.stdin is not None and sys.stdin.isatty()


@click.group()
def dlq() -> None:
    """List, show, replay and purge dead letters.

    Dead letters are messages that failed for good, kept whole with why they died.
    """


@dlq.command("list")
@filter_options
@click.option("--limit", type=int, default=100)
@click.option("--after", "after_id", type=int, metavar="ID", help="Only ids after ID (to page).")
@json_option()
@pass_session
def list_dead(
    session: Session, limit: int, after_id: int | None, as_json: bool, **filters: str | None
) -> None:
    """List dead letters matching every given filter, oldest first."""
    broker, chosen = session.reader(), _given(filters)
    found = broker.dead_letters.list(**chosen, limit=limit, after_id=after_id)
    listing(
        found_in(broker, chosen.get("subscription"), found),
        {
            "id": lambda d: d.id,
            "subscription": lambda d: d.subscription,
            "topic": lambda d: d.topic,
            "attempts": lambda d: f"{d.attempts}/{d.max_attempts}",
            "reason": lambda d: d.reason,
            "error type": lambda d: d.error_type,
            "dead at": lambda d: human_time(d.dead_at),
        },
        as_json=as_json,
        empty="no dead letters",
        numeric=["id", "attempts"],
        key="subscription",
        drop=["dead at", "error type", "attempts", "topic"],
    )


def _details(dead: DeadLetter) -> Table:
    error = (
        None
        if dead.error_type is None
        else f"{dead.error_type}: {dead.error_message or ''}".rstrip(": ")
    )
    return fields(
        [
            ("id", dead.id),
            ("message id", dead.message_id),
            ("subscription", dead.subscription),
            ("topic", dead.topic),
            ("priority", dead.priority),
            ("key", dead.key),
            ("idempotency key", dead.idempotency_key),
            ("attempts", f"{dead.attempts}/{dead.max_attempts}"),
            ("replays", dead.replay_count),
            ("reason", dead.reason),
            ("error", error),
            ("content type", dead.content_type),
            ("enqueued at", human_time(dead.enqueued_at)),
            ("first started at", human_time(dead.first_started_at)),
            ("first failed at", human_time(dead.first_failed_at)),
            ("last failed at", human_time(dead.last_failed_at)),
            ("dead at", human_time(dead.dead_at)),
            *([("damaged", dead.damaged)] if dead.damaged else []),
        ]
    )


@dlq.command("show")
@click.argument("dead_id", metavar="ID", type=int)
@json_option("Print the dead letter as JSON.")
@pass_session
def show_dead(session: Session, dead_id: int, as_json: bool) -> None:
    """Show one dead letter in full.

    The message, its payload and headers, why it died and the traceback.
    """
    dead = session.reader().dead_letters.get(dead_id)
    if as_json:
        echo_json(dead)
        return
    out = console()
    out.print(_details(dead))
    out.print(Text("\nheaders", style="bold"))
    if dead.headers:
        out.print(table(None, ["name", "value"], sorted(dead.headers.items())))
    else:
        out.print(Text("none", style="dim"))
    out.print(Text("\npayload", style="bold"))
    if dead.content_type == JSON_CONTENT_TYPE and not isinstance(dead.payload, bytes):
        out.print(json_view(dead.payload))
    else:
        out.print(literal(payload_preview(dead.payload, dead.content_type)))
    out.print(Text("\ntraceback", style="bold"))
    out.print(
        literal(dead.traceback.rstrip("\n"), multiline=True)
        if dead.traceback
        else Text("none", style="dim")
    )


def _confirm(session: Session, verb: str, filters: DeadSelection, everything: bool) -> bool:
    """Ask before acting on a selection by filter or ``--all``; ``False`` when nothing
    matches. Refuses (exit 2) when there is no terminal to ask on, and fails (exit 1)
    when the answer is no."""
    matching = session.broker().dead_letters.list(**filters, limit=CONFIRM_PREVIEW + 1)
    if not matching:
        return False
    amount = (
        f"more than {CONFIRM_PREVIEW}" if len(matching) > CONFIRM_PREVIEW else str(len(matching))
    )
    noun = "dead letter" if amount == "1" else "dead letters"
    scope = (
        ""
        if everything
        else " matching " + ", ".join(f"{name}={value!r}" for name, value in filters.items())
    )
    selection = f"{amount} {noun}{scope}"
    if not stdin_is_terminal():
        raise InvalidUsage(
            f"refusing to {verb} {selection} without confirmation:"
            " stdin is not a terminal, so pass --yes"
        )
    if not click.confirm(f"{verb.capitalize()} {selection}?", default=False, err=True):
        raise CliFailure(f"nothing was changed ({verb} not confirmed)")
    return True


def _act(
    session: Session,
    verb: str,
    ids: tuple[int, ...],
    everything: bool,
    yes: bool,
    note: str | None,
    as_json: bool,
    **filters: str | None,
) -> None:
    """Validate the selection, confirm when needed, replay or purge, and print how many
    (with ``--json``: the count and, for replay, the new delivery ids)."""
    chosen = _given(filters)
    if everything and (ids or chosen):
        raise InvalidUsage("--all cannot be combined with ids or filters")
    if not (everything or ids or chosen):
        raise InvalidUsage(
            "name dead letters by id or by filter (--subscription, --topic, --error-type,"
            " --reason), or pass --all"
        )
    count, delivery_ids = 0, []
    if ids or yes or _confirm(session, verb, chosen, everything):
        dead = session.broker().dead_letters
        if ids:
            _require_existing(dead, verb, ids)
        named = list(ids) or None
        actor = cli_actor()
        if verb == "replay":
            delivery_ids = dead.replay(named, **chosen, all=everything, actor=actor, note=note)
            count = len(delivery_ids)
        else:
            count = dead.purge(named, **chosen, all=everything, actor=actor, note=note)
        missing = len(set(ids)) - count
        if ids and missing > 0:
            raise CliFailure(
                f"{_PAST[verb]} {plural(count, 'dead letter')},"
                f" but {plural(missing, 'named dead letter')} did not match"
                " (excluded by a filter, or gone meanwhile)"
            )
    found_in(session.broker(), chosen.get("subscription"), count)
    if not as_json:
        click.echo(f"{_PAST[verb]} {plural(count, 'dead letter')}")
    elif verb == "replay":
        echo_json({"replayed": count, "delivery_ids": delivery_ids})
    else:
        echo_json({"purged": count})


def _require_existing(dead: DeadLetters, verb: str, ids: tuple[int, ...]) -> None:
    """Fail (exit 1, as ``dlq show`` of a missing id) before changing anything when a named
    dead letter does not exist, naming every missing id."""
    missing: list[int] = []
    for dead_id in sorted(set(ids)):
        try:
            dead.get(dead_id)
        except NotFound:
            missing.append(dead_id)
    if missing:
        shown = ", ".join(str(dead_id) for dead_id in missing)
        noun = "id" if len(missing) == 1 else "ids"
        raise CliFailure(f"no dead letter with {noun} {shown}; nothing was {_PAST[verb]}")


action_options = options(
    click.argument("ids", nargs=-1, type=click.IntRange(min=1)),
    filter_options,
    click.option("--all", "everything", is_flag=True, help="Every dead letter (asks first)."),
    click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
    note_option,
    json_option("Print the result as JSON."),
    pass_session,
)
"""Options shared by ``dlq replay`` and ``dlq purge``."""


@dlq.command("replay")
@action_options
def replay_dead(session: Session, **selection: Any) -> None:
    """Send dead letters back to their subscription.

    Attempts are reset and the replay is counted. Select them by IDS, by filters, or
    with --all; filters and --all ask for confirmation unless --yes is given.
    """
    _act(session, "replay", **selection)


@dlq.command("purge")
@action_options
def purge_dead(session: Session, **selection: Any) -> None:
    """Delete dead letters for good.

    Select them by IDS, by filters, or with --all; filters and --all ask for
    confirmation unless --yes is given.
    """
    _act(session, "purge", **selection)
