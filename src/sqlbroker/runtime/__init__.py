"""Layer 3: the asyncio runtime — pumps, write-back, lease keeping, reaping, wake-ups."""

from sqlbroker.runtime.message import Message
from sqlbroker.runtime.worker import Worker, WorkerCrashed

__all__ = ["Message", "Worker", "WorkerCrashed"]
