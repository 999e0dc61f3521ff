"""The loader a :class:`~chunkstream.BatchStream` built from a source makes and owns.

``cs.BatchStream(source, window=..., batch_size=..., device=...)`` builds the
:class:`~chunkstream.ChunkLoader` its tier needs, by the defaults' policy:

* **chunk size** (:func:`default_chunk_size`): :data:`CHUNK_BYTES` of every field
  (fewer where this rank's share of host memory is small: at most
  :data:`CHUNK_SHARE` of it), at least a window and a stored time chunk, a whole
  number of stored time chunks (a read then decodes no chunk twice), at most the
  source;
* **plan**: ``plan=`` when given (its chunk size), else one pass per epoch over
  the source (:func:`~chunkstream.plan_epoch`, this job's world size);
* **device**: the tier's (:func:`~chunkstream._memory.choose_tier` with no loader yet): the
  loader reads to host memory for the host tier, to the batches' device for the
  device tier.

The stream closes that loader with :meth:`~chunkstream.BatchStream.close` or at
the end of its ``with`` block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._device import resolve_device
from .._errors import ConfigError, check_int
from .._memory import choose_tier, node_share
from ..distributed import resolve_rank
from ..pipeline import ChunkLoader, LoaderOptions, ResolvedSettings, loader_settings
from ..plans import EpochPlan, plan_epoch
from ..sources import Source, check_source, stored_time_chunk

__all__ = ["CHUNK_BYTES", "CHUNK_SHARE", "default_chunk_size", "owned_loader"]

#: The bytes of one chunk (every field) a stream built from a source reads at a time.
CHUNK_BYTES = 64 << 20
#: At most this share of this rank's host memory per chunk.
CHUNK_SHARE = 1 / 32


def default_chunk_size(source: Source, window: int, host_bytes: int | None = None) -> int:
    """Timesteps per chunk for ``source`` (module docs)."""
    fields = source.fields or {}
    step = max(1, sum(f.step_nbytes for f in fields.values()))
    budget = CHUNK_BYTES if host_bytes is None else min(CHUNK_BYTES, int(host_bytes * CHUNK_SHARE))
    grid = max(1, stored_time_chunk(source))
    rows = max(budget // step, window, grid)
    rows = -(-rows // grid) * grid  # whole stored time chunks
    return max(1, min(rows, len(source)))


def owned_loader(
    source: object,
    *,
    window: int,
    batch_size: int | None,
    device: str | torch.device | None,
    buffer: str,
    plan: EpochPlan | None,
    loader_options: Mapping[str, Any] | None,
) -> tuple[ChunkLoader, EpochPlan]:
    """``(loader, plan)`` for a stream over ``source`` (module docs): the loader the
    stream's tier needs and the plan its epochs follow."""
    source = check_source(source)
    if source.fields is None:
        raise ConfigError.bad(
            "source",
            type(source).__name__,
            "a source whose fields are known before its first read",
            "Build a cs.ChunkLoader over it and pass the loader to BatchStream.",
        )
    window = check_int("window", window, minimum=1, fix="Pass the timesteps one sample needs.")
    kwargs = dict(loader_options or {})
    options = kwargs.pop("options", None) or LoaderOptions()
    where = resolve_device(device)
    share = node_share()
    if plan is None:
        batch_size = check_int(
            "batch_size",
            batch_size,
            minimum=1,
            fix="Pass the windows per batch (or plan=cs.plan_epoch(...)).",
        )
        chunk_size = kwargs.pop("chunk_size", None) or default_chunk_size(
            source, window, share.host_bytes
        )
        _, world = resolve_rank(options.rank, options.world_size)
        plan = plan_epoch(len(source), chunk_size, batch_size, world_size=world)
    else:
        chunk_size = plan.chunk_size
        kwargs.pop("chunk_size", None)
    step = sum(f.step_nbytes for f in source.fields.values())
    # The arena the loader will allocate on the CPU (the larger: the tier is not chosen
    # yet), from its settings resolved as the loader resolves them.
    settings = loader_settings(
        chunk_size,
        prefetch=kwargs.get("prefetch"),
        gpu_prefetch=kwargs.get("gpu_prefetch"),
        workers=kwargs.get("workers"),
        options=options,
        config=None,
    )
    config, rows = ResolvedSettings.for_source(source, on_cuda=False, **settings)
    tier, _ = choose_tier(
        buffer,
        where,
        chunk_nbytes=chunk_size * step,
        pass_chunks=max(1, plan.chunks_per_epoch),
        loader_nbytes=config.arena_bytes(rows * step, on_cuda=False),
        share=share,
    )
    loader_device = torch.device("cpu") if tier == "host" else where
    loader = ChunkLoader(source, chunk_size, device=loader_device, options=options, **kwargs)
    return loader, plan
