"""The public surface: ``Broker`` and ``AsyncBroker`` are two complete faces of one broker
(the same members, the same typed signatures), and ``sqlbroker.__all__`` is sorted and
complete."""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path

import sqlbroker

FACE_ONLY = {"__enter__", "__exit__", "__aenter__", "__aexit__"}
"""The context-manager protocols: one per face."""
DIFFERENT_RESULTS = {"once": ("Once", "AsyncOnce")}
"""Members that return the face's own kind of object rather than an awaitable."""


def _public(cls: type) -> dict[str, object]:
    """Public members as the class shows them (an operation as its face's method), and
    properties and static methods as they are declared."""
    members: dict[str, object] = {}
    for name in dir(cls):
        if name.startswith("_") and name not in FACE_ONLY:
            continue
        static = inspect.getattr_static(cls, name)
        members[name] = (
            static if isinstance(static, property | staticmethod) else getattr(cls, name)
        )
    return members


def _parameters(function: Callable[..., object]) -> list[inspect.Parameter]:
    """The signature's parameters, with a ``**options: Unpack[SomeOptions]`` expanded into
    one keyword-only parameter per key of that ``TypedDict`` (its annotation resolved), so
    that comparing signatures compares every option. An untyped ``**`` stays as it is."""
    parameters = list(inspect.signature(function).parameters.values())
    if not parameters or parameters[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        return parameters
    annotation = parameters[-1].annotation
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(sys.modules[function.__module__]))
    if typing.get_origin(annotation) is not typing.Unpack:
        return parameters
    (options,) = typing.get_args(annotation)
    hints = typing.get_type_hints(options, include_extras=True)
    assert set(hints) == options.__optional_keys__, f"{options.__name__} is total=False"
    expanded = [
        inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=hint)
        for key, hint in hints.items()
    ]
    return parameters[:-1] + expanded


def _attributes(cls: type) -> set[str]:
    """Instance attributes set by the constructor (``dead_letters``, ``subscribers``)."""
    broker = cls("sqlite:///:memory:")
    try:
        return {name for name in vars(broker) if not name.startswith("_")}
    finally:
        close = broker.close()
        if inspect.isawaitable(close):
            import asyncio

            asyncio.run(close)  # type: ignore[arg-type]


def test_both_faces_have_the_same_public_members() -> None:
    sync = set(_public(sqlbroker.Broker)) - FACE_ONLY
    async_ = set(_public(sqlbroker.AsyncBroker)) - FACE_ONLY
    assert sync == async_
    assert _attributes(sqlbroker.Broker) == _attributes(sqlbroker.AsyncBroker)
    assert {"subscriber", "run", "run_until_idle", "stop", "publish", "claim"} <= sync
    assert {"__enter__", "__exit__"} <= set(dir(sqlbroker.Broker))
    assert {"__aenter__", "__aexit__"} <= set(dir(sqlbroker.AsyncBroker))


def test_both_faces_have_the_same_signatures() -> None:
    """Parameters, kinds, annotations and defaults equal; results equal modulo awaiting:
    a coroutine on ``AsyncBroker`` wherever ``Broker`` does I/O."""
    sync_members = _public(sqlbroker.Broker)
    async_members = _public(sqlbroker.AsyncBroker)
    compared = 0
    options: dict[str, set[str]] = {}
    for name, sync_member in sync_members.items():
        if name in FACE_ONLY:
            continue
        async_member = async_members[name]
        if isinstance(sync_member, property):
            assert isinstance(async_member, property), name
            assert inspect.signature(sync_member.fget) == inspect.signature(async_member.fget)  # type: ignore[arg-type]
            continue
        if isinstance(sync_member, staticmethod):
            sync_member, async_member = sync_member.__func__, async_member.__func__  # type: ignore[attr-defined]
        if not callable(sync_member):
            continue
        sync_sig = inspect.signature(sync_member)
        async_sig = inspect.signature(async_member)  # type: ignore[arg-type]
        sync_parameters = _parameters(sync_member)
        assert sync_parameters == _parameters(async_member), name  # type: ignore[arg-type]
        assert all(p.kind is not p.VAR_KEYWORD for p in sync_parameters) or name == "__init__", (
            f"{name} takes untyped **options"
        )
        options[name] = {p.name for p in sync_parameters}
        if name in DIFFERENT_RESULTS:
            assert (sync_sig.return_annotation, async_sig.return_annotation) == (
                DIFFERENT_RESULTS[name]
            )
            continue
        assert sync_sig.return_annotation == async_sig.return_annotation, name
        if inspect.iscoroutinefunction(sync_member):
            assert inspect.iscoroutinefunction(async_member), name
        compared += 1
    assert compared >= 45
    # The option groups (``**options: Unpack[...]``) are compared key by key.
    assert {"grace", "write_backlog", "subscriptions", "timeout"} <= options["run_until_idle"]
    assert {"priority", "idempotency_key", "conn"} <= options["send_many"]
    assert {"name", "queue", "prefetch", "fair"} <= options["subscriber"]
    constructor = inspect.signature(sqlbroker.Broker)
    assert constructor == inspect.signature(sqlbroker.AsyncBroker)
    assert [p.name for p in constructor.parameters.values() if p.kind is p.VAR_KEYWORD] == [
        "backend_options"
    ]
    # What does I/O is a coroutine on the async face and a plain call on the sync one.
    for name in ("publish", "send_many", "claim", "complete", "stats", "run", "close"):
        assert not inspect.iscoroutinefunction(getattr(sqlbroker.Broker, name)), name
        assert inspect.iscoroutinefunction(getattr(sqlbroker.AsyncBroker, name)), name


def test_no_member_takes_untyped_options() -> None:
    """A ``**`` parameter is an option group, ``Unpack[SomeOptions]``, never bare."""
    for cls in (sqlbroker.Broker, sqlbroker.AsyncBroker):
        for name, member in _public(cls).items():
            if callable(member) and not isinstance(member, type):
                parameters = _parameters(getattr(member, "__func__", member))
                assert all(p.kind is not p.VAR_KEYWORD for p in parameters), f"{cls}.{name}"


def test_dead_letters_and_once_are_complete_on_both_faces() -> None:
    from sqlbroker.features.dead_letters import AsyncDeadLetters, DeadLetters
    from sqlbroker.features.processed import AsyncOnce, Once

    for sync, async_ in ((DeadLetters, AsyncDeadLetters), (Once, AsyncOnce)):
        sync_names = {n for n in dir(sync) if not n.startswith("_")}
        assert sync_names == {n for n in dir(async_) if not n.startswith("_")}
        for name in sync_names:
            member = getattr(sync, name)
            if callable(member):
                assert inspect.signature(member) == inspect.signature(getattr(async_, name))


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's ``__all__`` order (RUF022): CONSTANTS, then Classes, then the rest."""
    kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return kind, name


def test_all_is_sorted_and_every_name_imports() -> None:
    names = sqlbroker.__all__
    assert names == sorted(names, key=_isort_key)
    assert len(set(names)) == len(names)
    for name in names:
        assert getattr(sqlbroker, name) is not None, name


def test_all_is_complete() -> None:
    """Every public name the package module defines or imports is exported (no module
    objects), and nothing private is."""
    defined = {
        name
        for name, value in vars(sqlbroker).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert defined == set(sqlbroker.__all__) - {"__version__"}


def test_one_class_per_public_name() -> None:
    """No second class named like a public one inside the package (there were two
    ``Broker`` classes)."""
    source = Path(sqlbroker.__file__).parent
    names = {name for name in sqlbroker.__all__ if isinstance(getattr(sqlbroker, name), type)}
    found: dict[str, list[str]] = {}
    for path in source.rglob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith("class "):
                name = line[6:].split("(")[0].split(":")[0]
                if name in names:
                    found.setdefault(name, []).append(str(path.relative_to(source)))
    assert {name: places for name, places in found.items() if len(places) > 1} == {}


def test_a_misspelt_option_is_refused_by_name() -> None:
    """``**options`` takes any keyword: one outside its group is an ``InvalidOption``
    naming it, raised before anything is written (a signature refused it before)."""
    import pytest

    with sqlbroker.Broker("sqlite:///:memory:") as broker:
        broker.subscribe("jobs", ["jobs"])
        with pytest.raises(sqlbroker.InvalidOption, match="priorty"):
            broker.publish("jobs", 1, priorty=1)  # type: ignore[call-arg]
        with pytest.raises(sqlbroker.InvalidOption, match="dedupe"):
            broker.send_many("jobs", [1, 2], dedupe=60)  # type: ignore[call-arg]
        assert broker.pending("jobs") == []

        with pytest.raises(sqlbroker.InvalidOption, match="concurency"):
            broker.subscriber(queue="jobs", concurency=2)(print)  # type: ignore[call-arg]
        assert broker.subscribers == {}
        saga = sqlbroker.Saga("order", [sqlbroker.Step("pay")])
        with pytest.raises(sqlbroker.InvalidOption, match="transaction"):
            broker.saga_step(saga, "pay", transaction=True)  # type: ignore[call-arg]
        assert broker.subscribers == {}

        @broker.subscriber(queue="jobs")
        def handle(msg: sqlbroker.Message) -> None: ...

        with pytest.raises(sqlbroker.InvalidOption, match="graceful"):
            broker.run_until_idle(graceful=1.0)  # type: ignore[call-arg]


def test_every_conn_parameter_is_a_caller_connection() -> None:
    """``conn=`` is typed as the one named kind, ``CallerConnection``, on every member of
    both faces and their dead letters (no ``Any``)."""
    from sqlbroker.features.dead_letters import AsyncDeadLetters, DeadLetters

    found = []
    for cls in (sqlbroker.Broker, sqlbroker.AsyncBroker, DeadLetters, AsyncDeadLetters):
        for name, member in _public(cls).items():
            if callable(member) and not isinstance(member, type):
                for parameter in _parameters(getattr(member, "__func__", member)):
                    if parameter.name == "conn":
                        found.append(f"{cls.__name__}.{name}")
                        assert parameter.annotation == "CallerConnection | None", found[-1]
    assert {"Broker.publish", "AsyncBroker.send_many", "AsyncBroker.complete"} <= set(found)
