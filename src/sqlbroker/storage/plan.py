"""Operations as plans of named SQL blocks, independent of the driver and its I/O.

An operation is written once, as a generator: it yields a :class:`Query` (a block name and
its parameters) and is sent back the :class:`Rows` that statement returned, until it
returns the operation's result. A dialect supplies the SQL of each block and runs the plan
on a sync or an async connection; the plan never sees which.

Parameters are plain Python values (``str``, numbers, ``bool``, ``datetime``, sequences of
those); the dialect encodes them (SQLite: times as Unix seconds, sequences as JSON arrays;
PostgreSQL: as they are). Every statement also receives ``now``: the operation's clock
reading, the same for all its statements (``None`` on PostgreSQL unless a test clock
overrides the database's own).

A statement whose rows the plan does not read may go :func:`ahead` of the next one: the
dialect may then send both in one round trip (PostgreSQL: a pipeline, in which they also
commit together), and the plan must not read the ``Rows`` sent back for it (PostgreSQL's
are empty).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlbroker.storage.url import redact

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


# Not frozen: nothing changes a Query, and a frozen dataclass costs a call per field to
# make (one is made for every statement).
@dataclass(slots=True)
class Query:
    """One statement of a plan: the SQL block ``block`` with ``params``. With ``named``
    its rows are addressable by column name (``row["id"]``), else by position. With
    ``each`` it runs once per mapping of it (merged over ``params``), its rows unread.
    With ``ahead`` its rows are not read either (see :func:`ahead`)."""

    block: str
    params: Mapping[str, Any]
    named: bool = False
    each: Sequence[Mapping[str, Any]] = ()
    ahead: bool = False


class Rows(list[Any]):
    """The rows a statement returned, and how many rows it changed (``rowcount``)."""

    __slots__ = ("rowcount",)

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        super().__init__(rows)
        self.rowcount = rowcount


Plan = Generator[Query, Rows, T]


class StatementFailed(Exception):
    """Raised by a dialect's ``step`` for a statement that failed on its own: run alone in
    autocommit, nothing of the plan's sent with it, so that every statement the plan ran
    before it has committed and stays. :func:`drive` throws it into the plan at that
    statement's ``yield``, ``committed`` telling whether the plan ran statements before
    it: a plan whose earlier writes make sense without the rest may catch it and carry
    on; uncaught, it goes on to the backend, which translates the driver's ``error``.
    Inside a transaction (ours or a caller's) a failed statement undoes the plan's
    writes, and the error is never handed to the plan."""

    def __init__(self, error: Exception) -> None:
        lines = redact(str(error)).strip().splitlines()
        super().__init__(lines[0] if lines else type(error).__name__)
        self.error = error
        self.committed = False


def drive(plan: Plan[T], step: Callable[[Query], Rows]) -> T:
    """Run ``plan`` to its result, each of its statements by ``step`` (a dialect's)."""
    ran = False
    try:
        statement = next(plan)
        while True:
            try:
                rows = step(statement)
            except StatementFailed as failed:
                failed.committed = ran
                statement = plan.throw(failed)
                continue
            ran = True
            statement = plan.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def drive_async(plan: Plan[T], step: Callable[[Query], Awaitable[Rows]]) -> T:
    """:func:`drive` with a coroutine ``step``."""
    ran = False
    try:
        statement = next(plan)
        while True:
            try:
                rows = await step(statement)
            except StatementFailed as failed:
                failed.committed = ran
                statement = plan.throw(failed)
                continue
            ran = True
            statement = plan.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def query(block: str, /, **params: Any) -> Query:
    """A statement whose rows are read by position."""
    return Query(block, params)


def each(block: str, rows: Sequence[Mapping[str, Any]], /, **params: Any) -> Query:
    """A one-statement block run once per row of ``rows`` (the driver's ``executemany``),
    returning no rows, only the total ``rowcount``."""
    return Query(block, params, each=rows)


def ahead(block: str, /, **params: Any) -> Query:
    """A statement sent with the plan's next one when the dialect can (its rows unread):
    a claim's promotion of due delayed copies costs no round trip of its own."""
    return Query(block, params, ahead=True)


COMMIT_POINT = ""
"""The block name of :func:`commit_point`."""


def commit_point() -> Query:
    """Not a statement: the plan's writes so far may commit here, and what the plan does
    next (Python work) may run outside the transaction; a statement it yields after it
    runs in a write transaction of its own. Where the operation runs in a transaction it
    does not own (a caller's, :meth:`Backend.begin`), nothing happens. SQLite's claim
    decodes its rows after it, outside the write lock (``Settings.one_writer``). PostgreSQL
    runs it as nothing: alone, each statement commits on its own anyway."""
    return Query(COMMIT_POINT, {})


def changed(block: str, /, **params: Any) -> Plan[bool]:
    """A statement run for what it changes: whether it changed a row (found its target)."""
    done = yield Query(block, params)
    return done.rowcount > 0


def changed_count(block: str, /, **params: Any) -> Plan[int]:
    """A statement run for what it changes: how many rows it changed."""
    done = yield Query(block, params)
    return max(0, done.rowcount)


def named(block: str, /, **params: Any) -> Query:
    """A statement whose rows are read by column name."""
    return Query(block, params, named=True)


@dataclass(frozen=True, slots=True)
class Access:
    """How an operation touches the database, which decides how a backend runs it alone.

    - ``read_only``: outside any write transaction (SQLite takes no write lock);
    - ``atomic``: several writes that apply all or nothing — PostgreSQL runs them in one
      transaction (SQLite runs every write in one anyway); without it PostgreSQL commits
      each statement on its own, which saves two round trips, so an operation without it
      is one that may fail partly done: what its committed statements did must stand, and
      trying it again must not do that twice (its errors say so: ``core.errors.undone``);
    - ``relaxed``: its commit need not wait for the disk (a claim: a crash of the machine
      can only forget the lease, and the copy comes back); honoured unless the backend
      keeps durable claims.
    """

    read_only: bool = False
    atomic: bool = False
    relaxed: bool = False
    atomic_when: Callable[..., bool] | None = None
    """Instead of ``atomic``: whether one call's writes must apply all or nothing, from
    its settings and keyword arguments (an operation that is often one statement)."""

    def of_call(self, settings: Any, kwargs: Mapping[str, Any]) -> Access:
        """The access of one call with ``kwargs``."""
        if self.atomic_when is None:
            return self
        return ATOMIC if self.atomic_when(settings, **kwargs) else WRITE


WRITE = Access()
ATOMIC = Access(atomic=True)


def _mark(plan: F, **flags: Any) -> F:
    plan.access = Access(**flags)  # type: ignore[attr-defined]
    return plan


def reads(plan: F) -> F:
    """Mark a read-only operation (see :class:`Access`)."""
    return _mark(plan, read_only=True)


def atomic(plan: F) -> F:
    """Mark an operation whose writes apply all or nothing (see :class:`Access`)."""
    return _mark(plan, atomic=True)


def atomic_when(test: Callable[..., bool]) -> Callable[[F], F]:
    """Mark an operation atomic for the calls where ``test(settings, **kwargs)`` holds;
    the others are one statement, which PostgreSQL commits alone (no BEGIN, no COMMIT)."""

    def mark(plan: F) -> F:
        return _mark(plan, atomic_when=test)

    return mark


def relaxed(plan: F) -> F:
    """Mark an operation whose commit need not wait for the disk (see :class:`Access`)."""
    return _mark(plan, relaxed=True)


def access_of(plan: Callable[..., Any]) -> Access:
    access: Access = getattr(plan, "access", WRITE)
    return access
