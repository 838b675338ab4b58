"""No SQL is built from strings at run time, and nothing is unpickled or evaluated.

Both checks read the syntax tree of every module in ``src/sqlbroker`` (comments and
docstrings cannot trip them, and a violation cannot hide behind formatting). Each rule is
also run on a planted violation, so a checker that silently stopped matching would fail.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import sqlbroker
from sqlbroker.features.security import role_names

SOURCE = Path(sqlbroker.__file__).resolve().parent
MODULES = sorted(SOURCE.rglob("*.py"))

EXECUTE_METHODS = frozenset({"execute", "executemany", "executescript", "exec_driver_sql"})
"""Calls whose first argument (or ``query=``/``sql=``/``statement=``) is SQL text."""
SQL_KEYWORDS = ("query", "sql", "statement")
PSYCOPG_COMPOSABLES = frozenset({"Identifier", "Literal", "Placeholder"})

UNSAFE_MODULES = frozenset(
    {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
)
UNSAFE_BUILTINS = frozenset({"eval", "exec", "compile", "__import__"})
UNSAFE_ATTRIBUTES = {
    "yaml": frozenset({"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load"}),
    "pandas": frozenset({"read_pickle"}),
    "numpy": frozenset({"load"}),
}


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _literal(node: ast.expr) -> bool:
    """A string written out in the source (also ``"a" "b"`` and ``"a" + "b"``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str | bytes)
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(part, ast.Constant) for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left) and _literal(node.right)
    return False


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _named_block(node: ast.expr) -> bool:
    """``sql["block_name"]``: a named block of a ``.sql`` file, looked up by a literal name."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    )


def _psycopg_sql(node: ast.expr) -> bool:
    """``sql.SQL("literal")`` or ``sql.SQL(blocks["name"])``: psycopg's composable
    statement template, written in the source or in a ``.sql`` file."""
    return (
        isinstance(node, ast.Call)
        and _dotted(node.func).split(".")[-1] == "SQL"
        and len(node.args) == 1
        and (_literal(node.args[0]) or _named_block(node.args[0]))
    )


def _composable(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] in PSYCOPG_COMPOSABLES


class _Scope:
    """The assignments of one function (or the module body) to plain names."""

    def __init__(self, body: ast.AST) -> None:
        self.values: dict[str, list[ast.expr]] = {}
        self.augmented: dict[str, list[ast.AugAssign]] = {}
        for node in _walk_own(body):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.values.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                if isinstance(node.target, ast.Name):
                    self.values.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                self.augmented.setdefault(node.target.id, []).append(node)


def _walk_own(root: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``root``'s body, not descending into nested functions or classes."""
    stack = list(ast.iter_child_nodes(root))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _how_built(node: ast.expr, scope: _Scope, seen: frozenset[str] = frozenset()) -> str | None:
    """How SQL text ``node`` was built from non-literal strings, or None if it was not."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        method = node.func.attr
        if method in ("encode", "strip", "rstrip", "lstrip") and not node.args:
            return _how_built(node.func.value, scope, seen)
        if method == "format":
            if _psycopg_sql(node.func.value) and all(
                _composable(arg) for arg in [*node.args, *(k.value for k in node.keywords)]
            ):
                return None
            return ".format()"
        if method == "join":
            return ".join()"
    if isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "SQL" and node.args:
        if not _literal(node.args[0]):
            inner = _how_built(node.args[0], scope, seen)
            return f"sql.SQL({inner or 'a non-literal'})"
        return None
    if isinstance(node, ast.JoinedStr):
        return None if _literal(node) else "an f-string"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return None if _literal(node.left) and _literal(node.right) else "% formatting"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return None if _literal(node) else "+ concatenation"
    if isinstance(node, ast.IfExp):
        return _how_built(node.body, scope, seen) or _how_built(node.orelse, scope, seen)
    if isinstance(node, ast.Name) and node.id not in seen:
        if any(not _literal(aug.value) for aug in scope.augmented.get(node.id, [])):
            return f"{node.id} += …"
        for value in scope.values.get(node.id, []):
            found = _how_built(value, scope, seen | {node.id})
            if found:
                return f"{found} (assigned to {node.id})"
    return None


def _sql_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg in SQL_KEYWORDS:
            return keyword.value
    return call.args[0] if call.args else None


def built_sql(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, how) for every execute-style call whose SQL was built at run time."""
    found = []
    scopes: list[ast.AST] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for root in scopes:
        scope = _Scope(root)
        for node in _walk_own(root):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in EXECUTE_METHODS
            ):
                continue
            argument = _sql_argument(node)
            how = None if argument is None else _how_built(argument, scope)
            if how:
                found.append((node.lineno, how))
    return sorted(found)


def unsafe_deserialization(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for every import of a pickle-like module and every eval/exec-like call."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, f"import {alias.name}")
                for alias in node.names
                if alias.name.split(".")[0] in UNSAFE_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in UNSAFE_MODULES:
                found.append((node.lineno, f"from {node.module} import …"))
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if isinstance(node.func, ast.Name) and name in UNSAFE_BUILTINS:
                found.append((node.lineno, f"{name}()"))
            elif isinstance(node.func, ast.Attribute):
                owner = _dotted(node.func.value).split(".")[0]
                owner = {"np": "numpy", "pd": "pandas"}.get(owner, owner)
                builtin = owner in ("builtins", "__builtins__")
                if (builtin and node.func.attr in UNSAFE_BUILTINS) or (
                    node.func.attr in UNSAFE_ATTRIBUTES.get(owner, ())
                ):
                    found.append((node.lineno, f"{name}()"))
    return sorted(found)


def _report(findings: dict[str, list[tuple[int, str]]]) -> str:
    return "\n".join(
        f"{path}:{line}: {how}" for path, items in findings.items() for line, how in items
    )


def test_the_source_tree_is_scanned() -> None:
    names = {path.relative_to(SOURCE).as_posix() for path in MODULES}
    assert {"storage/postgres/backend.py", "storage/sqlite/connection.py"} <= names
    assert len(MODULES) > 50


def test_no_sql_is_built_from_strings_at_run_time() -> None:
    findings = {
        path.relative_to(SOURCE).as_posix(): built
        for path in MODULES
        if (built := built_sql(_parse(path)))
    }
    assert not findings, (
        "SQL built at run time; put it in a .sql file of named blocks (the only"
        " substitution is the validated schema) or compose it with psycopg.sql:\n"
        + _report(findings)
    )


def test_nothing_is_unpickled_or_evaluated() -> None:
    findings = {
        path.relative_to(SOURCE).as_posix(): found
        for path in MODULES
        if (found := unsafe_deserialization(_parse(path)))
    }
    assert not findings, "unsafe deserialization or evaluation:\n" + _report(findings)


PLANTED_SQL = {
    "f-string": 'conn.execute(f"SELECT * FROM {table}")',
    "percent": 'cursor.execute("DELETE FROM t WHERE id = %s" % user_id)',
    "plus": 'conn.execute("SELECT * FROM " + table)',
    "format": 'conn.executemany("INSERT INTO {} VALUES (?)".format(table), rows)',
    "join": 'conn.execute(" ".join(["SELECT", column, "FROM t"]))',
    "through a name": 'statement = f"DROP TABLE {name}"\nconn.execute(statement)',
    "augmented": 'statement = "SELECT 1"\nstatement += where\nconn.execute(statement)',
    "encoded": 'conn.execute(f"SET ROLE {role}".encode())',
    "keyword": 'engine.exec_driver_sql(sql=f"VACUUM {table}")',
    "script": 'conn.executescript("PRAGMA " + pragma)',
    "psycopg template": 'conn.execute(sql.SQL(f"LISTEN {channel}"))',
    "psycopg raw text": 'conn.execute(sql.SQL("LISTEN {}").format(channel))',
}

SAFE_SQL = {
    "named block": 'conn.execute(self._sql["message_claim"], params)',
    "literal": 'conn.execute("BEGIN IMMEDIATE")',
    "implicit concatenation": 'conn.execute("SELECT 1" " FROM t")',
    "psycopg identifier": 'conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ch)))',
    "bound parameters": 'conn.execute("SELECT %(x)s", {"x": f"{value}%"})',
    "comment": '# conn.execute(f"SELECT {x}")\nconn.execute("SELECT 1")',
    "docstring": 'def f():\n    """conn.execute(f"SELECT {x}")"""\n    conn.execute("SELECT 1")',
}


@pytest.mark.parametrize("source", PLANTED_SQL.values(), ids=PLANTED_SQL.keys())
def test_the_sql_check_catches_a_planted_violation(source: str) -> None:
    wrapped = "def planted():\n" + textwrap.indent(source, "    ")
    assert built_sql(ast.parse(wrapped)), source
    assert built_sql(ast.parse(source)), f"at module level: {source}"


@pytest.mark.parametrize("source", SAFE_SQL.values(), ids=SAFE_SQL.keys())
def test_the_sql_check_accepts_safe_statements(source: str) -> None:
    assert not built_sql(ast.parse(source)), source


PLANTED_UNSAFE = {
    "pickle": "import pickle\npickle.loads(data)",
    "from-import": "from marshal import loads",
    "shelve": "import shelve as s",
    "eval": "value = eval(text)",
    "exec": "exec(code)",
    "builtins": "import builtins\nbuiltins.eval(text)",
    "yaml": "import yaml\nyaml.load(text, Loader=yaml.Loader)",
    "cloudpickle": "from cloudpickle import loads",
}


@pytest.mark.parametrize("source", PLANTED_UNSAFE.values(), ids=PLANTED_UNSAFE.keys())
def test_the_deserialization_check_catches_a_planted_violation(source: str) -> None:
    assert unsafe_deserialization(ast.parse(source)), source


def test_the_deserialization_check_accepts_safe_code() -> None:
    source = (
        "import json, re, yaml\n"
        "# pickle.loads(x) in a comment\n"
        "json.loads(text); re.compile(pattern); yaml.safe_load(text)\n"
        "literal_eval = 'eval(x)'\n"
    )
    assert not unsafe_deserialization(ast.parse(source))


HOSTILE_SCHEMAS = [
    'x"; DROP TABLE sqlbroker_message; --',
    "public.sqlbroker_message",
    "Queue",
    "a b",
    "x" * 64,
    "1queue",
    "",
    "q\x00",
]


@pytest.mark.parametrize("schema", HOSTILE_SCHEMAS)
def test_a_hostile_schema_name_is_refused_before_any_sql(schema: str) -> None:
    """The port is closed: any attempt to run SQL would fail with ConnectionLost instead."""
    with pytest.raises(sqlbroker.InvalidOption, match="schema"):
        sqlbroker.Broker("postgresql://app@127.0.0.1:9/db", schema=schema)
    from sqlbroker.interfaces.cli.admin import schema_sql

    with pytest.raises(sqlbroker.InvalidOption, match="schema"):
        schema_sql("postgresql://app@127.0.0.1:9/db", schema)


def test_a_valid_schema_is_quoted_where_it_reaches_sql() -> None:
    from sqlbroker.storage.postgres.backend import PostgresBackend

    printed = PostgresBackend.schema_sql("queue_1")
    assert 'CREATE TABLE "queue_1".sqlbroker_message' in printed
    assert "CREATE TABLE queue_1." not in printed


@pytest.mark.parametrize("prefix", ['x"; DROP ROLE postgres; --', "Upper", "a-b", "", "x" * 41])
def test_a_hostile_role_prefix_is_refused_before_any_sql(prefix: str) -> None:
    with pytest.raises(sqlbroker.InvalidOption, match="prefix"):
        role_names(prefix)


def test_schema_on_sqlite_is_bad_input_not_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(sqlbroker.InvalidOption, match="schema"):
        sqlbroker.Broker(f"sqlite:///{tmp_path}/x.db", schema="queue")
