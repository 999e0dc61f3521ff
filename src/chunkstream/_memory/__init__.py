"""Host memory: how much a loader holds, and the arena it holds it in.

:mod:`._model` is the memory model shared by ``ChunkLoader``'s budgets and
``chunkstream plan``; :mod:`._arena` the host buffer sets the readers fill (one
arena, pinned on CUDA); :mod:`._job` the host memory the job may use (the
smaller of ``MemAvailable`` and the room under its cgroup limit), which
everything sized from host memory reads.
"""

from ._arena import BufferSet, HostBufferPool, PinnedSlotPool
from ._job import ENV_HOST_MEMORY, JobMemory, job_memory, parse_bytes, parse_memory
from ._model import (
    CUDA_MARGIN_FRACTION,
    CUDA_MARGIN_MIN,
    LOOP_HELD,
    budget_depths,
    resident_decision,
    streaming_bytes,
)

__all__ = [
    "CUDA_MARGIN_FRACTION",
    "CUDA_MARGIN_MIN",
    "ENV_HOST_MEMORY",
    "LOOP_HELD",
    "BufferSet",
    "HostBufferPool",
    "JobMemory",
    "PinnedSlotPool",
    "budget_depths",
    "job_memory",
    "parse_bytes",
    "parse_memory",
    "resident_decision",
    "streaming_bytes",
]
