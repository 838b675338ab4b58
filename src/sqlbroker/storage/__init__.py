"""Layer 1: the storage seam — one Backend of batch-first queue operations, each written
once over a thin dialect per database. Each dialect owns its SQL (``.sql`` files of named
blocks) and its numbered migrations; above this package nothing speaks SQL.
"""

from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.storage.backend import Backend
from sqlbroker.storage.base import DeadFilter, ReapResult
from sqlbroker.storage.factory import open_backend

__all__ = [
    "Backend",
    "DeadFilter",
    "Lease",
    "ReapResult",
    "Settlement",
    "open_backend",
]
