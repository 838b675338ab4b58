"""Two faces over one base: each operation of the broker is written once, as a plan, and
run by the blocking face (:class:`Blocking`) or the awaiting one (:class:`Awaiting`).

A plan is a generator method of the base (see :mod:`sqlbroker.client.base`; dead letters
and processed keys use it too): it checks its arguments, yields each storage :class:`Call`
it needs and is sent back the result (or has the call's error raised at its ``yield``), and
returns the operation's result. The blocking face
runs a call on the backend; the awaiting face awaits it on the backend's coroutine
operations (``backend.async_ops``: PostgreSQL's async pool of the running loop, SQLite's own
thread), with no thread hop of its own. So the two faces have the same members with the
same signatures by construction, and one home for each rule.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sqlbroker.storage import caller
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.caller import CallerConnection

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")


@dataclass(slots=True)
class Call:
    """A storage operation a plan asks its face to run: ``name`` with ``kwargs``, inside
    the caller's transaction when ``conn`` is given. ``blocking`` runs a function instead:
    called as is by the blocking face; the awaiting face awaits ``awaiting()`` if given,
    else runs ``blocking`` on the backend's own threads (``Backend.offload``: work with no
    coroutine form, such as a migration or the sagas' sweep). (Not ``frozen``: one is
    made for every call, and a frozen dataclass costs a call per field to make.)
    """

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    conn: CallerConnection | None = None
    blocking: Callable[[], Any] | None = None
    awaiting: Callable[[], Awaitable[Any]] | None = None


Plan = Generator[Call, Any, T]


def call(name: str, /, *, conn: CallerConnection | None = None, **kwargs: Any) -> Call:
    """The storage operation ``name`` (a method of ``Executor``), for a plan to yield."""
    return Call(name, kwargs, conn)


def blocking(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> Call:
    """A blocking function for a plan to yield (no coroutine twin exists)."""
    return Call(function.__name__, blocking=functools.partial(function, *args, **kwargs))


class Face(ABC):
    """What both faces share: the backend, checked before the first operation."""

    _backend: Backend

    @abstractmethod
    def _ready(self) -> Backend:
        """The backend, its schema checked (and migrated, if the broker was told to)."""

    @abstractmethod
    async def _ready_async(self) -> Backend:
        """:meth:`_ready` on the running loop."""


class Part(Face):
    """A part of a broker with operations of its own (its dead letters, a processed key):
    the broker's backend, checked as the broker checks it."""

    def __init__(self, broker: Face) -> None:
        self._broker = broker
        self._backend = broker._backend

    def _ready(self) -> Backend:
        return self._broker._ready()

    async def _ready_async(self) -> Backend:
        return await self._broker._ready_async()


class Blocking(Face):
    """The blocking face: each operation returns its result."""

    def _drive(self, plan: Plan[T], checked: bool = True) -> T:
        backend = self._ready() if checked else self._backend
        try:
            effect = next(plan)
            while True:
                try:
                    result = run_call(backend, effect)
                except Exception as error:
                    effect = plan.throw(error)
                else:
                    effect = plan.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            plan.close()


class Awaiting(Face):
    """The awaiting face: each operation is a coroutine, run on the caller's loop."""

    async def _drive(self, plan: Plan[T], checked: bool = True) -> T:
        return await drive_async(await self._ready_async() if checked else self._backend, plan)


async def drive_async(backend: Backend, plan: Plan[T]) -> T:
    """Run a face's plan on the running loop, each call as :func:`run_call_async` runs it;
    a plain storage operation (no ``conn``, nothing blocking) is awaited directly, one
    coroutine less on every call."""
    try:
        effect = next(plan)
        while True:
            try:
                if effect.conn is None and effect.blocking is None and effect.awaiting is None:
                    result = await getattr(backend.async_ops, effect.name)(**effect.kwargs)
                else:
                    result = await run_call_async(backend, effect)
            except Exception as error:
                effect = plan.throw(error)
            else:
                effect = plan.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        plan.close()


def run_call(backend: Backend, effect: Call) -> Any:
    """Run one call of a plan, blocking."""
    if effect.blocking is not None:
        return effect.blocking()
    if effect.conn is None:
        return getattr(backend, effect.name)(**effect.kwargs)
    with backend.begin(effect.conn) as tx:
        return getattr(tx, effect.name)(**effect.kwargs)


async def run_call_async(backend: Backend, effect: Call) -> Any:
    """Run one call of a plan on the running loop (its blocking work on the backend's own
    threads). A caller's sync connection (sqlite3, psycopg's ``Connection``) is used on the
    calling thread, where its owner uses it."""
    if effect.awaiting is not None:
        return await effect.awaiting()
    if effect.blocking is not None:
        return await backend.offload(effect.blocking)
    conn = effect.conn
    if conn is None:
        return await getattr(backend.async_ops, effect.name)(**effect.kwargs)
    if not caller.is_async(conn):
        return run_call(backend, effect)
    async with backend.begin_async(conn) as tx:
        return await getattr(tx, effect.name)(**effect.kwargs)


class Operation(Generic[S, P, T]):
    """A plan of the base as a method of each face: returning on :class:`Blocking`,
    awaitable on :class:`Awaiting`, with the plan's parameters, docstring and result.
    ``checked``: the schema is checked (and migrated, if the broker was told to) before
    it runs. Used as ``operation(plan)`` or as the decorator ``@operation``."""

    def __init__(self, plan: Callable[Concatenate[S, P], Plan[T]], *, checked: bool = True) -> None:
        self.plan = plan
        self.checked = checked
        self._methods: dict[type, Callable[..., Any]] = {}

    @overload
    def __get__(self, face: Awaiting, owner: type) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, face: Blocking, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, face: None, owner: type) -> Callable[..., Any]: ...
    def __get__(self, face: Face | None, owner: type) -> Callable[..., Any]:
        method = self._methods.get(owner) or self._method(owner)
        return method if face is None else method.__get__(face, owner)

    def _method(self, owner: type) -> Callable[..., Any]:
        plan, checked = self.plan, self.checked
        method: Callable[..., Any]
        if issubclass(owner, Awaiting):

            async def method(face: Any, /, *args: Any, **kwargs: Any) -> Any:
                return await face._drive(plan(face, *args, **kwargs), checked)

        elif issubclass(owner, Blocking):

            def method(face: Any, /, *args: Any, **kwargs: Any) -> Any:
                return face._drive(plan(face, *args, **kwargs), checked)

        else:
            return plan  # the base itself: the plan
        functools.update_wrapper(method, plan)
        method.__qualname__ = f"{owner.__qualname__}.{plan.__name__}"
        signature = inspect.signature(plan)
        face, *parameters = signature.parameters.values()
        returns = str(signature.return_annotation)
        signature = signature.replace(
            parameters=[face.replace(name="self", annotation=face.empty), *parameters],
            return_annotation=returns.removeprefix("Plan[").removesuffix("]"),
        )
        vars(method).update(__signature__=signature)  # what inspect and help() show
        del vars(method)["__wrapped__"]
        self._methods[owner] = method
        return method


operation = Operation
