"""Host memory: how much a loader and a stream hold, and the arena they hold it in.

:mod:`._model` is the memory model shared by ``ChunkLoader``'s budgets and
``chunkstream plan``; :mod:`._arena` the host buffer sets the readers fill (one
arena, pinned on CUDA); :mod:`._job` the host memory the job may use (the
smaller of ``MemAvailable`` and the room under its cgroup limit), which
everything sized from host memory reads; :mod:`._node` this process's share of
the node (that memory over the job's ranks on the node, its CPUs and thread
budget), which every size the library picks by itself goes through; :mod:`._defaults`
the defaults' policy for a shuffle buffer (how much of that share it takes, on which
tier: :mod:`._buffer`), and :mod:`._stream` what a stream of batches holds beside its
loader (its batch sets and buffer), one count for the stream and the trainer.
"""

from ._arena import BufferSet, HostBufferPool, PinnedSlotPool
from ._buffer import (
    BufferInfo,
    check_mix,
    choose_tier,
    default_buffer,
    host_tier_hint,
    plan_buffer,
    quality_note,
)
from ._defaults import HOST_SHARE, batch_sets
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
from ._stream import stream_buffer, stream_held

__all__ = [
    "CUDA_MARGIN_FRACTION",
    "CUDA_MARGIN_MIN",
    "ENV_CPUS",
    "ENV_HOST_MEMORY",
    "ENV_RANKS",
    "HOST_SHARE",
    "LOOP_HELD",
    "BufferInfo",
    "BufferSet",
    "HostBufferPool",
    "JobMemory",
    "NodeShare",
    "PinnedSlotPool",
    "arena_bytes",
    "batch_sets",
    "budget_depths",
    "check_arena_fits",
    "check_mix",
    "choose_tier",
    "cpu_share",
    "default_buffer",
    "host_tier_hint",
    "job_memory",
    "node_share",
    "parse_bytes",
    "parse_memory",
    "plan_buffer",
    "quality_note",
    "ranks_on_node",
    "read_node_share",
    "resident_decision",
    "stream_buffer",
    "stream_held",
    "streaming_bytes",
    "thread_budget",
]
