"""Error texts and dead-letter reasons come from arbitrary exceptions and handlers: a NUL
(which PostgreSQL's text columns refuse) or a lone surrogate (not UTF-8) is stored escaped,
identically on both backends, and reads back; a broken ``__str__`` still leaves a record."""

from __future__ import annotations

import json

import sqlbroker
from helpers import claim_one
from sqlbroker.core.message import ErrorInfo
from sqlbroker.core.settlements import Lease, Settlement

NASTY = "bad\x00byte \ud800 and \udc80 end"
STORED = "bad\\x00byte \\ud800 and \\udc80 end"


class NastyError(Exception):
    pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def test_a_retry_error_with_nul_and_lone_surrogates_is_stored_escaped(
    broker: sqlbroker.Broker,
) -> None:
    broker.send("q", 1)
    broker.retry(claim_one(broker, "q"), after=3600, error=NASTY)
    (pending,) = broker.pending("q")
    assert pending.last_error is not None
    assert json.loads(pending.last_error) == {"type": "str", "message": STORED}


def test_a_dead_letter_error_with_nul_and_lone_surrogates_is_stored_escaped(
    broker: sqlbroker.Broker,
) -> None:
    broker.send("q", 1)
    broker.dead_letter(claim_one(broker, "q"), reason="nasty", error=NastyError(NASTY))
    (dead,) = broker.dead_letters.list()
    assert dead.error_type == f"{__name__}.NastyError"
    assert dead.error_message == STORED
    assert dead.traceback is not None
    assert dead.traceback.rstrip().endswith(f"NastyError: {STORED}")
    assert broker.dead_letters.list(error_type=f"{__name__}.NastyError") == [dead]


def test_the_last_retry_dead_letters_with_the_escaped_error(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1, max_attempts=1)
    broker.retry(claim_one(broker, "q"), error=NastyError(NASTY))
    (dead,) = broker.dead_letters.list()
    assert dead.error_message == STORED


def test_an_exception_whose_str_fails_is_still_recorded(broker: sqlbroker.Broker) -> None:
    broker.send("q", 1)
    broker.dead_letter(claim_one(broker, "q"), reason="unprintable", error=Unprintable())
    (dead,) = broker.dead_letters.list()
    assert dead.error_type == f"{__name__}.Unprintable"
    assert dead.error_message == f"<{__name__}.Unprintable: str() of the exception failed>"


def test_a_reason_with_nul_and_lone_surrogates_is_stored_escaped(
    broker: sqlbroker.Broker,
) -> None:
    """A handler's ``Reject(reason)`` reaches storage unvalidated (the worker's write-back
    would retry a refused dead-letter batch for ever)."""
    broker.send("q", 1)
    delivery = claim_one(broker, "q")
    death = Settlement.dead(Lease.of(delivery), NASTY, ErrorInfo(type=NASTY, message=NASTY))
    assert broker.backend.message_settle_many(settlements=[death]) == [delivery.id]
    (dead,) = broker.dead_letters.list()
    assert (dead.reason, dead.error_type, dead.error_message) == (STORED, STORED, STORED)
    assert broker.dead_letters.list(reason_contains="\\x00byte") == [dead]


def test_error_texts_stay_bounded_after_escaping() -> None:
    info = ErrorInfo(type="\x00" * 1000, message="\x00" * 5000, traceback="\x00" * 20_000)
    assert len(info.type) == ErrorInfo.MAX_TYPE
    assert len(info.message) == ErrorInfo.MAX_MESSAGE
    assert info.traceback is not None
    assert info.traceback.startswith(ErrorInfo.TRUNCATED)
    assert len(info.traceback) == ErrorInfo.MAX_TRACEBACK + len(ErrorInfo.TRUNCATED)
