"""Systems under test. Each module offers ``NAME``, ``BACKENDS`` (the targets it runs on),
``WORKLOADS`` (name → function of a fresh database and the sizes, returning a sample) and
``consume(args)`` (the body of its consumer process, run by ``bench/consumer.py``).

To add a peer (pgqueuer, procrastinate, pgmq), write a module with the same four names and
list it here; the harness, the results and the ratios pick it up.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SYSTEMS = {
    "sqlbroker": "systems.sqlbroker_system",
    "floor": "systems.pg_floor",
}


def load(name: str) -> ModuleType:
    return importlib.import_module(SYSTEMS[name])
