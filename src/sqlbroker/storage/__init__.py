"""Layer 1: one Backend protocol of batch-first queue operations, one implementation per
database. Each backend owns its SQL (``.sql`` files of named blocks) and its numbered
migrations; above this package nothing speaks SQL.
"""

from sqlbroker.storage.base import Backend, DeadFilter, DeadRequest, Lease, ReapResult, RetryRequest
from sqlbroker.storage.factory import open_backend

__all__ = [
    "Backend",
    "DeadFilter",
    "DeadRequest",
    "Lease",
    "ReapResult",
    "RetryRequest",
    "open_backend",
]
