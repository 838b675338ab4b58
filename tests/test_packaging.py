"""The package as users get it: the wheel built from this tree, installed into a fresh venv.

``test_wheel_installs_and_runs`` builds the wheel (``pip wheel``, hatchling from the package
index), checks it carries every file of ``src/sqlbroker`` (the SQL blocks and migrations,
``py.typed``, the dashboard's static files, the Django app's migrations), installs it with its
two dependencies into a new venv and runs ``sqlbroker --version``, ``import sqlbroker`` and a
SQLite migration there, from the wheel rather than this source tree.

``test_extra_imports`` checks, in a fresh interpreter of the test venv (which has every
extra), that each extra's own third-party modules and the sqlbroker module it exists for
import on their own; every extra ``pyproject.toml`` declares must be listed here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import sqlbroker

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "sqlbroker"

# extra -> the modules that must import with it: its dependencies, then sqlbroker's module.
EXTRA_IMPORTS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg", "psycopg_pool", "sqlbroker.storage.postgres.backend"),
    "cron": ("croniter", "sqlbroker.core.schedules"),
    "metrics": ("prometheus_client", "sqlbroker.interfaces.prometheus"),
    "otel": ("opentelemetry.trace", "sqlbroker.interfaces.otel"),
    "spark": ("pyspark", "pyarrow", "pandas", "adbc_driver_postgresql", "sqlbroker.spark"),
    "faststream": ("faststream", "sqlbroker.contrib.faststream"),
    "celery": ("celery", "kombu", "sqlbroker.contrib.celery"),
    "django": ("django", "django_tasks", "sqlbroker.contrib.django_tasks"),
    "fastapi": ("fastapi", "sqlbroker.contrib.fastapi"),
}
# Extras the issue requires (issue 27, part 6); others in EXTRA_IMPORTS are checked if declared.
REQUIRED_EXTRAS = ("postgres", "cron", "metrics", "otel", "spark", "faststream", "celery", "django")


def _declared_extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return {name: deps for name, deps in extras.items() if name != "dev"}


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    """The environment without anything that would put this source tree on the path."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "SQLBROKER_URL")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "wheel",
        "--no-deps",
        "--quiet",
        "--wheel-dir",
        dist,
        ROOT,
        cwd=tmp_path,
        env=_clean_env(),
    )
    (wheel,) = dist.glob("sqlbroker-*.whl")
    assert wheel.name.startswith(f"sqlbroker-{sqlbroker.__version__}-")

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    sources = {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert sources - names == set(), "files of src/sqlbroker missing from the wheel"
    for required in (
        "sqlbroker/py.typed",
        "sqlbroker/storage/postgres/migrations/0001_initial.sql",
        "sqlbroker/storage/sqlite/migrations/0001_initial.sql",
        "sqlbroker/storage/sqlite/queries.sql",
        "sqlbroker/interfaces/dashboard/static/index.html",
        "sqlbroker/interfaces/dashboard/static/app.js",
        "sqlbroker/interfaces/dashboard/static/app.css",
    ):
        assert required in names
    assert len([name for name in names if name.endswith(".sql")]) >= 30
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as archive:
        assert "sqlbroker = sqlbroker.interfaces.cli:main" in archive.read(entry_points).decode()

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=_clean_env())
    bin_dir = venv / "bin"
    env = _clean_env()
    env["NO_COLOR"] = "1"
    _run(
        bin_dir / "python",
        "-m",
        "pip",
        "--disable-pip-version-check",
        "install",
        "--quiet",
        wheel,
        cwd=tmp_path,
        env=env,
    )

    version = _run(bin_dir / "sqlbroker", "--version", cwd=tmp_path, env=env)
    assert version.strip() == f"sqlbroker, version {sqlbroker.__version__}"
    probe = (
        "import importlib.metadata, sqlbroker\n"
        "print(sqlbroker.__file__)\n"
        "print(importlib.metadata.version('sqlbroker'))\n"
        "print(sqlbroker.__version__)\n"
    )
    location, metadata_version, module_version = (
        _run(bin_dir / "python", "-I", "-c", probe, cwd=tmp_path, env=env).strip().splitlines()
    )
    assert Path(location).is_relative_to(venv), location  # the wheel's copy, not src/
    assert metadata_version == module_version == sqlbroker.__version__

    # The packaged SQL works: a fresh SQLite database migrated by the installed CLI.
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    _run(bin_dir / "sqlbroker", "--url", url, "migrate", cwd=tmp_path, env=env)
    schema = _run(bin_dir / "sqlbroker", "--url", url, "schema", cwd=tmp_path, env=env)
    assert schema.strip()


def test_every_declared_extra_is_checked() -> None:
    declared = _declared_extras()
    unchecked = set(declared) - set(EXTRA_IMPORTS)
    assert unchecked == set(), f"add the modules of these extras to EXTRA_IMPORTS: {unchecked}"


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(set(EXTRA_IMPORTS) | set(REQUIRED_EXTRAS)))
def test_extra_imports(extra: str, tmp_path: Path) -> None:
    if extra not in _declared_extras():
        pytest.skip(f"pyproject.toml declares no extra {extra!r} yet")
    modules = EXTRA_IMPORTS[extra]
    env = _clean_env()
    env["PYTHONPATH"] = str(ROOT / "src")
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    _run(sys.executable, "-c", code, *modules, cwd=tmp_path, env=env)
