"""A backend shows its kind and where its database is in ``repr``, never a password (a
repr lands in logs and tracebacks)."""

from __future__ import annotations

from sqlbroker.storage.factory import open_backend


def test_repr_names_the_backend_and_its_database_but_no_password(backend_url: str) -> None:
    if backend_url.startswith("sqlite"):
        url, kind, shown_part = backend_url, "SqliteBackend(", backend_url.split("///", 1)[1]
    else:
        scheme, rest = backend_url.split("://", 1)
        user, where = rest.split("@", 1)
        url = f"{scheme}://{user}:hunter2@{where}"
        kind, shown_part = "PostgresBackend(", where.split("?", 1)[0]
    backend = open_backend(url)
    try:
        shown = repr(backend)
    finally:
        backend.close()
    assert shown.startswith(kind), shown
    assert shown_part in shown, shown
    assert "hunter2" not in shown, shown
