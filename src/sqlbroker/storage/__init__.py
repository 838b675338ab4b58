"""Layer 1: one Backend protocol of batch-first queue operations, one implementation per
database. Each backend owns its SQL (``.sql`` files of named blocks) and its numbered
migrations; above this package nothing speaks SQL.
"""

from sqlbroker.storage.base import Backend, DeadFilter, Lease, ReapResult, Settlement
from sqlbroker.storage.factory import open_backend

__all__ = [
    "Backend",
    "DeadFilter",
    "Lease",
    "ReapResult",
    "Settlement",
    "open_backend",
]
