"""Host memory: how much a loader holds, and the arena it holds it in.

:mod:`._model` is the memory model shared by ``ChunkLoader``'s budgets and
``chunkstream plan``; :mod:`._arena` the host buffer sets the readers fill (one
arena, pinned on CUDA); :mod:`._job` the host memory the job may use (the
smaller of ``MemAvailable`` and the room under its cgroup limit), which
everything sized from host memory reads; :mod:`._node` this process's share of
the node (that memory over the job's ranks on the node, its CPUs and thread
budget), which every size the library picks by itself goes through.
"""

from ._arena import BufferSet, HostBufferPool, PinnedSlotPool
from ._job import ENV_HOST_MEMORY, JobMemory, job_memory, parse_bytes, parse_memory
from ._model import (
    CUDA_MARGIN_FRACTION,
    CUDA_MARGIN_MIN,
    LOOP_HELD,
    arena_bytes,
    budget_depths,
    check_arena_fits,
    resident_decision,
    streaming_bytes,
)
from ._node import (
    ENV_CPUS,
    ENV_RANKS,
    NodeShare,
    cpu_share,
    node_share,
    ranks_on_node,
    read_node_share,
    thread_budget,
)

__all__ = [
    "CUDA_MARGIN_FRACTION",
    "CUDA_MARGIN_MIN",
    "ENV_CPUS",
    "ENV_HOST_MEMORY",
    "ENV_RANKS",
    "LOOP_HELD",
    "BufferSet",
    "HostBufferPool",
    "JobMemory",
    "NodeShare",
    "PinnedSlotPool",
    "arena_bytes",
    "budget_depths",
    "check_arena_fits",
    "cpu_share",
    "job_memory",
    "node_share",
    "parse_bytes",
    "parse_memory",
    "ranks_on_node",
    "read_node_share",
    "resident_decision",
    "streaming_bytes",
    "thread_budget",
]
