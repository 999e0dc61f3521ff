"""``StreamOptions``: a :class:`~chunkstream.BatchStream`'s less common settings, as data.

As :class:`~chunkstream.LoaderOptions` for the loader: the stream takes its
common settings as keywords (``window``, ``batch_size``, ``batches_per_chunk``,
``plan``, ``mix``, ``buffer``, ``device``, ``fields``) and the rest in one
frozen, keyword-only object.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StreamOptions"]


@dataclass(frozen=True, kw_only=True)
class StreamOptions:
    """The less common settings of a :class:`~chunkstream.BatchStream` (``options=``).

    Every field has a row in docs/parameters.md; a bad value is refused when the
    stream is built, naming the field.

    batches_per_epoch, chunks_per_epoch:
        An epoch's length on this rank, in batches or in whole chunks (give at
        most one). ``batches_per_epoch`` reads ``ceil(batches_per_epoch /
        batches_per_chunk)`` chunks, the last one feeding the remainder;
        ``chunks_per_epoch=n`` means ``n * batches_per_chunk`` batches. With
        neither, a plan gives ``plan.batches_per_epoch // plan.world_size``
        (the issue's per-epoch batch count, split over the ranks); without a
        plan, one pass of the loader's plan in chunks (``shuffled`` /
        ``sequential``; ``random`` needs a number).
    seed:
        Seeds the batch starts; ``None`` takes the loader's plan seed.
    dtype:
        Compute dtype of floating-point fields (e.g. ``torch.float32`` for
        fields stored as float16): converted in the gather, batch by batch, so
        the chunk stays in its stored dtype (see :func:`~chunkstream.gather_windows`); bool
        and integer fields keep theirs. ``None`` keeps every stored dtype.
    align:
        Window starts are absolute timesteps that are multiples of ``align``
        (e.g. ``time_units``, the acquisition period), drawn uniformly over all
        such starts inside one piece (see :func:`~chunkstream.sample_windows`); ``1`` (the
        default) is every start. A chunk with no aligned start raises
        :class:`~chunkstream.ConfigError` at its first batch; ``ChunkLoader(align=)``
        with a multiple of ``align`` puts the chunks and pieces on the grid too.
    host_memory:
        Bytes ``mix="auto"`` may give the host tier's buffer; ``None``: half of
        what this rank's part of the job's host memory, read by the loader before
        it allocated (``ChunkLoader.share``, :func:`chunkstream._memory.node_share`:
        the job's memory over its ranks on the node), leaves beside the loader's
        arena.
    batch_prefetch:
        Batches read (and copied) ahead of the one yielded from host storage:
        the depth of the loader's batch run.
    gather_threads:
        The loader's batch readers (``chunkstream-batch-<n>``), each reading
        whole batches; ``None``: this rank's share of the cores (its thread
        budget), at most 4.
    """

    chunks_per_epoch: int | None = None
    batches_per_epoch: int | None = None
    seed: int | None = None
    dtype: torch.dtype | None = None
    align: int = 1
    host_memory: int | None = None
    batch_prefetch: int = 2
    gather_threads: int | None = None
