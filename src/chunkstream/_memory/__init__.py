"""Host memory: how much a loader holds, and the arena it holds it in.

:mod:`._model` is the memory model shared by ``ChunkLoader``'s budgets and
``chunkstream plan``; :mod:`._arena` the host buffer sets the readers fill (one
arena, pinned on CUDA).
"""

from ._arena import BufferSet, HostBufferPool, PinnedSlotPool
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
    "LOOP_HELD",
    "BufferSet",
    "HostBufferPool",
    "PinnedSlotPool",
    "budget_depths",
    "resident_decision",
    "streaming_bytes",
]
