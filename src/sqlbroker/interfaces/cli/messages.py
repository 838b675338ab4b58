"""Commands that move messages: ``send``, ``publish``, ``claim`` and ``cancel``."""

from __future__ import annotations

from typing import Any

import click

from sqlbroker.interfaces.cli.params import (
    DURATION,
    PRIORITY,
    json_option,
    note_option,
    options,
    parse_headers,
    read_payload,
)
from sqlbroker.interfaces.cli.render import human_time, listing, payload_preview, plural
from sqlbroker.interfaces.cli.session import (
    InvalidUsage,
    Session,
    cli_actor,
    found_in,
    pass_session,
)

publish_options = options(
    click.argument("payload"),
    click.option(
        "--priority",
        type=PRIORITY,
        help="0-9 (0 most urgent) or urgent/high/normal/low. [default: normal]",
    ),
    click.option("--delay", type=DURATION, help="Deliver no sooner than this (30, 5m)."),
    click.option("--ttl", type=DURATION, help="Expire, undelivered, after this long."),
    click.option("--key", help="Ordering key: one key's messages are handled in order."),
    click.option(
        "--replace",
        is_flag=True,
        help="Take the place of the --key's pending message of this topic, if any.",
    ),
    click.option(
        "--debounce",
        type=DURATION,
        help="Replace (as --replace) and deliver once the --key is quiet this long.",
    ),
    click.option(
        "--debounce-max",
        type=DURATION,
        help="With --debounce: deliver at the latest this long after the first publish.",
    ),
    click.option("--idempotency-key", help="A repeated key returns the first message id."),
    click.option(
        "--header", "headers", multiple=True, metavar="NAME=VALUE", help="A header (repeatable)."
    ),
    click.option("--max-attempts", type=int, help="Deliveries before dead-lettering."),
    click.option(
        "--raw", is_flag=True, help="Send PAYLOAD as bytes instead of parsing it as JSON."
    ),
    click.option(
        "--content-type",
        help="Content type of a --raw payload. [default: application/octet-stream]",
    ),
    pass_session,
)
"""The payload and message options ``send`` and ``publish`` share."""


def _message(
    payload: str,
    raw: bool,
    content_type: str | None,
    headers: tuple[str, ...],
    priority: int | None,
    **options: Any,
) -> tuple[Any, dict[str, Any]]:
    """The payload and the publish keyword arguments the command line gives."""
    if content_type is not None and not raw:
        raise InvalidUsage("--content-type needs --raw (JSON payloads are application/json)")
    options.update(headers=parse_headers(headers) or None, content_type=content_type)
    if priority is not None:
        options["priority"] = priority
    return read_payload(payload, raw=raw), options


@click.command()
@click.argument("queue")
@publish_options
def send(session: Session, queue: str, payload: str, raw: bool, **options: Any) -> None:
    """Send a message to a queue; print its id.

    Point-to-point: only the queue QUEUE gets PAYLOAD. PAYLOAD is JSON text, or - to
    read it from stdin. The queue is created on first use.
    """
    value, publish_kwargs = _message(payload, raw, **options)
    click.echo(session.broker().send(queue, value, **publish_kwargs))


@click.command()
@click.argument("topic")
@publish_options
def publish(session: Session, topic: str, payload: str, raw: bool, **options: Any) -> None:
    """Publish a message to a topic; print its id.

    Every subscription whose pattern matches TOPIC gets a copy. PAYLOAD is JSON text,
    or - to read it from stdin. A topic no subscription matches is archived as
    unrouted.
    """
    value, publish_kwargs = _message(payload, raw, **options)
    click.echo(session.broker().publish(topic, value, **publish_kwargs))


@click.command()
@click.argument("subscription")
@click.option("--limit", type=int, default=1, help="Claim at most this many.")
@click.option("--lease", type=DURATION, help="Lease length (e.g. 30, 2m). [default: 30s]")
@click.option("--complete", is_flag=True, help="Acknowledge the claimed deliveries at once.")
@json_option("Print the deliveries as JSON.")
@pass_session
def claim(
    session: Session,
    subscription: str,
    limit: int,
    lease: float | None,
    complete: bool,
    as_json: bool,
) -> None:
    """Claim deliveries and print them.

    For operators and testing: leases up to --limit messages of SUBSCRIPTION, most
    urgent first. Without
    --complete the deliveries stay leased: they are delivered again once the lease
    expires. With --complete they are acknowledged and archived as completed.
    """
    broker = session.broker()
    deliveries = found_in(
        broker,
        subscription,
        broker.claim(subscription, limit=limit, lease=lease, worker=f"cli:{broker.worker_name()}"),
    )
    if deliveries and complete:
        broker.complete(deliveries)
    listing(
        deliveries,
        {
            "id": lambda d: d.id,
            "topic": lambda d: d.topic,
            "attempt": lambda d: f"{d.attempt}/{d.max_attempts}",
            "payload": lambda d: payload_preview(d.payload, d.content_type),
        },
        as_json=as_json,
        empty=f"nothing to claim in {subscription}",
        damaged=None,
        numeric=["id"],
    )
    if not deliveries:
        return
    if complete:
        click.secho(
            f"completed {plural(len(deliveries), 'delivery', 'deliveries')}",
            fg="green",
            err=as_json,
        )
    else:
        until = human_time(max(d.lease_expires_at for d in deliveries))
        click.echo(
            f"leased until {until}; not completed, so they will be delivered again after that",
            err=True,
        )


@click.command()
@click.argument("message_id")
@note_option
@pass_session
def cancel(session: Session, message_id: str, note: str | None) -> None:
    """Cancel the message MESSAGE_ID in every subscription.

    Copies not running are archived as cancelled at once; a running copy's worker stops
    its handler (within about a second) and archives it as cancelled. The cancel is
    recorded in the audit trail.
    """
    count = session.broker().cancel(message_id, actor=cli_actor(), note=note)
    click.echo(f"cancelled {plural(count, 'copy', 'copies')} of message {message_id}")
