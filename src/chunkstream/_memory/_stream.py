"""What a stream of batches holds beside its loader: the batch lane's sets and the shuffle buffer.

One count for every consumer that builds a :class:`~chunkstream.BatchStream` (the
stream itself, a stream from a source before its loader exists, the reference trainer):
:func:`stream_held` is the batch lane's buffer sets in the compute dtype and the
source's decode scratch, counted in this rank's budget (``held`` terms) *before* the
buffer is sized; :func:`stream_buffer` sizes the buffer of a stream over
an existing loader (its chunk length, plan, arena and node share) by the defaults'
policy (:mod:`._defaults`, :func:`~._buffer.plan_buffer`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .._errors import ConfigError
from ._buffer import BufferInfo, plan_buffer
from ._defaults import batch_sets_nbytes

__all__ = ["stream_buffer", "stream_held"]


def stream_held(
    specs: Mapping[str, Any],
    fields: Iterable[str],
    *,
    batch_size: int,
    window: int,
    batch_prefetch: int,
    cuda: bool,
    dtype: torch.dtype | None = None,
    decode_scratch: int = 0,
    lane: bool = True,
) -> dict[str, int]:
    """The ``held`` terms of a stream (what it allocates beside its loader's arena and its
    buffer, by name), counted before the buffer is sized:

    * ``"the batch sets"``: the batch lane's :func:`~._defaults.batch_sets` sets of one
      batch of ``fields`` (``specs``: the source's
      :class:`~chunkstream.sources.FieldSpec` by name; a field not known yet counts
      nothing), each field in ``dtype`` where given (the compute dtype), else its stored
      one; none where no lane runs (``lane`` false: the device tier on a CUDA loader
      gathers on the device);
    * ``"decode scratch"``: the source's ``decode_scratch``
      (:func:`chunkstream.sources.decode_scratch_nbytes`).
    """
    step = 0
    for name in fields if lane else ():
        spec = specs.get(name)
        if spec is not None:
            itemsize = spec.dtype.itemsize if dtype is None else dtype.itemsize
            step += spec.step_nbytes // spec.dtype.itemsize * itemsize
    sets = batch_sets_nbytes(batch_size * window * step, batch_prefetch, cuda=cuda)
    return {"the batch sets": sets, "decode scratch": int(decode_scratch)}


def stream_buffer(
    loader: Any,
    fields: tuple[str, ...],
    *,
    mix: object,
    tier: str,
    why: str,
    device: torch.device,
    host_memory: int | None,
    held: Mapping[str, int],
) -> BufferInfo:
    """The :class:`~._buffer.BufferInfo` of a stream over ``loader`` (a
    :class:`~chunkstream.ChunkLoader`) holding ``fields``: ``mix`` (``None``: ``"auto"``,
    or 1 while the source's fields are unknown) on ``tier``, beside the loader's arena
    and what else the rank allocates for the stream, by name (``held``: the batch lane's
    sets and the source's decode scratch, :func:`stream_held`)."""
    specs = loader.source.fields or {}
    chunk_nbytes = sum(loader.rows * specs[n].step_nbytes for n in fields if n in specs)
    segments = loader.plan.segments
    split = segments.timesteps if segments is not None else len(loader.source)
    pass_chunks = loader.chunks_per_pass or -(-split // loader.rows)
    if mix is None:  # the default: "auto" once the fields' sizes are known
        mix = "auto" if chunk_nbytes else 1
        if not chunk_nbytes:
            why += "; mix=1: the source's fields are unknown until its first read"
    if mix == "auto" and not chunk_nbytes:
        raise ConfigError.bad(
            "mix",
            mix,
            "an int until the source's fields are known (its first read)",
            "Pass mix as a number of chunks.",
        )
    loader_nbytes = loader.config.arena_bytes(
        loader.rows * sum(f.step_nbytes for f in specs.values()),
        on_cuda=loader.device.type == "cuda",
    )
    return plan_buffer(
        mix,
        tier,
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        pieces=int(loader.plan.pieces),
        device=device,
        host_memory=host_memory,
        loader_nbytes=loader_nbytes,
        why=why,
        share=loader.share,
        held=held,
    )
