"""``sqlbroker subscriptions flow``: a subscription's concurrency caps, rate limits and
fairness (docs/flow-control.md)."""

from __future__ import annotations

from typing import Any

import click

from sqlbroker.interfaces.cli.params import json_option
from sqlbroker.interfaces.cli.render import listing
from sqlbroker.interfaces.cli.session import (
    InvalidUsage,
    Session,
    cli_actor,
    name_to_set,
    pass_session,
)

_OFF = "none"


# The options whose name is not the keyword of Broker.set_flow they set.
_KEYWORDS = {"rate": "rate_limit", "key_rate": "key_rate_limit"}


def _limit(option: str, value: Any) -> Any:
    """The value of the option ``option`` (a parameter name) as given to
    ``Broker.set_flow``: ``none`` removes the limit, a cap must be an integer, a rate stays
    text (the broker rejects a bad one in its own words, as for any caller)."""
    if option == "fair":
        return value
    if value.strip().lower() == _OFF:
        return None
    if option in _KEYWORDS:
        return value
    try:
        return int(value)
    except ValueError:
        flag = "--" + option.replace("_", "-")
        raise InvalidUsage(f"{flag} must be an integer or 'none', not {value!r}") from None


@click.command()
@click.argument("name", required=False)
@click.option("--max-running", metavar="N|none", help="Copies running at once, by all workers.")
@click.option("--key-concurrency", metavar="N|none", help="Copies of one ordering key at once.")
@click.option("--rate", metavar="N/PERIOD|none", help="Claims per period: 100/min, 5/s.")
@click.option("--key-rate", metavar="N/PERIOD|none", help="Claims per period of each key.")
@click.option("--fair/--no-fair", default=None, help="Take the ordering keys in turn.")
@click.option("--reset", is_flag=True, help="Remove the limits not given with this command.")
@json_option()
@pass_session
def flow(session: Session, name: str | None, reset: bool, as_json: bool, **given: Any) -> None:
    """Show or set flow limits: concurrency caps, rate limits, fairness.

    Without options, show every subscription's limits (or NAME's), its running copies and
    whether claims wait now. With options, change NAME's for every worker at once: 'none'
    removes a limit, the limits not named stay (--reset: are removed).
    """
    limits = {
        _KEYWORDS.get(option, option): _limit(option, value)
        for option, value in given.items()
        if value is not None
    }
    if limits or reset:
        target = name_to_set(name, "flow limits")
        rows = [session.broker().set_flow(target, reset=reset, actor=cli_actor(), **limits)]
    else:
        rows = session.reader().flow(name)
    listing(
        rows,
        {
            "subscription": lambda f: f.subscription + (" (throttled)" if f.throttled else ""),
            "max running": lambda f: f.limits.max_running,
            "per key": lambda f: f.limits.key_concurrency,
            "rate": lambda f: f.limits.rate_limit,
            "key rate": lambda f: f.limits.key_rate_limit,
            "fair": lambda f: "yes" if f.limits.fair else "no",
            "running": lambda f: f.running,
        },
        as_json=as_json,
        empty="no subscriptions yet",
        damaged=None,
    )
