"""The web dashboard: a stdlib HTTP server, a small JSON API and a static page of vanilla
JavaScript and SVG (no build step, no third-party assets). See :mod:`.server` for the
security model and :mod:`.api` for what each page reads."""

from sqlbroker.interfaces.dashboard.api import Extension, Table
from sqlbroker.interfaces.dashboard.server import Dashboard

__all__ = ["Dashboard", "Extension", "Table"]
