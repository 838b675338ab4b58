"""Systems under test. Each module offers ``NAME``, ``BACKENDS`` (the targets it runs on),
``WORKLOADS`` (name → function of a fresh database and the sizes, returning a sample) and
``consume(args)`` (the body of its consumer process, run by ``bench/consumer.py``).

A peer runs in its own environment: its module also offers ``IMPLEMENTATIONS`` (the workload
functions, run inside ``bench/.peers-venv`` by ``bench/peer_run.py``) and its ``WORKLOADS``
are bridges to them (``peer_common.remote_workloads``). List it here and in ``PEERS``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SYSTEMS = {
    "sqlbroker": "systems.sqlbroker_system",
    "floor": "systems.pg_floor",
    "pgqueuer": "systems.pgqueuer_system",
    "procrastinate": "systems.procrastinate_system",
    "pgmq": "systems.pgmq_system",
    "huey": "systems.huey_system",
}
PEERS = ("pgqueuer", "procrastinate", "pgmq", "huey")
"""Systems installed into ``bench/.peers-venv`` and run there (``bench/peers.py``)."""


def load(name: str) -> ModuleType:
    return importlib.import_module(SYSTEMS[name])
