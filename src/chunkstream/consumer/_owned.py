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
* **device**: the tier's (:func:`~chunkstream._memory.choose_tier` with no loader yet,
  as the trainer asks it: the stream's ``mix``, its ``host_memory``, and beside the
  loader's arena what else the stream allocates, its batch sets and the source's
  decode scratch): the loader reads to host memory for the host tier, to the
  batches' device for the device tier.

The stream closes that loader with :meth:`~chunkstream.BatchStream.close` or at
the end of its ``with`` block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._device import resolve_device
from .._errors import ConfigError, check_int
from .._memory import NodeShare, choose_tier, node_share, stream_held
from ..distributed import resolve_rank
from ..pipeline import ChunkLoader, LoaderOptions, ResolvedSettings, loader_settings
from ..plans import EpochPlan, plan_epoch
from ..sources import Source, check_source, decode_scratch_nbytes, stored_time_chunk
from ._options import StreamOptions
from ._settings import choose_fields

__all__ = ["CHUNK_BYTES", "CHUNK_SHARE", "default_chunk_size", "owned_loader", "owned_tier"]

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
    mix: object,
    fields: object,
    options: StreamOptions | None,
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
    loader_opts = kwargs.pop("options", None) or LoaderOptions()
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
        _, world = resolve_rank(loader_opts.rank, loader_opts.world_size)
        plan = plan_epoch(len(source), chunk_size, batch_size, world_size=world)
    else:
        chunk_size = plan.chunk_size
        kwargs.pop("chunk_size", None)
        batch_size = plan.batch_size if batch_size is None else batch_size
    # The arena the loader will allocate on the CPU (the larger: the tier is not chosen
    # yet), from its settings resolved as the loader resolves them.
    settings = loader_settings(
        chunk_size,
        prefetch=kwargs.get("prefetch"),
        gpu_prefetch=kwargs.get("gpu_prefetch"),
        workers=kwargs.get("workers"),
        options=loader_opts,
        config=None,
    )
    config, rows = ResolvedSettings.for_source(source, on_cuda=False, **settings)
    step = sum(f.step_nbytes for f in source.fields.values())
    tier = owned_tier(
        source,
        buffer=buffer,
        device=where,
        mix=mix,
        fields=fields,
        options=options,
        chunk_size=chunk_size,
        batch_size=int(batch_size),
        window=window,
        pass_chunks=max(1, plan.chunks_per_epoch),
        loader_nbytes=config.arena_bytes(rows * step, on_cuda=False),
        share=share,
    )
    loader_device = torch.device("cpu") if tier == "host" else where
    loader = ChunkLoader(source, chunk_size, device=loader_device, options=loader_opts, **kwargs)
    return loader, plan


def owned_tier(
    source: Source,
    *,
    buffer: str,
    device: torch.device,
    mix: object,
    fields: object,
    options: StreamOptions | None,
    chunk_size: int,
    batch_size: int,
    window: int,
    pass_chunks: int,
    loader_nbytes: int,
    share: NodeShare,
    device_memory: int | None = None,
) -> str:
    """The tier of a stream over ``source`` (whose fields are known) before its loader
    exists: :func:`~chunkstream._memory.choose_tier` asked with what the stream will
    hold (the chunks of its ``fields``, its batch sets in the compute dtype, the
    source's decode scratch) and its ``mix`` and ``host_memory``, so a stream built
    from a source and one built from a loader on that tier's device agree."""
    o = options if isinstance(options, StreamOptions) else StreamOptions()  # checked later
    specs = source.fields or {}
    chosen = choose_fields(source, fields)
    held = stream_held(
        specs,
        chosen,
        batch_size=batch_size,
        window=window,
        batch_prefetch=o.batch_prefetch,
        cuda=device.type == "cuda",
        dtype=o.dtype,
        decode_scratch=decode_scratch_nbytes(source),
    )
    tier, _ = choose_tier(
        buffer,
        device,
        mix="auto" if mix is None else mix,
        chunk_nbytes=chunk_size * sum(specs[n].step_nbytes for n in chosen if n in specs),
        pass_chunks=pass_chunks,
        loader_nbytes=loader_nbytes,
        host_memory=o.host_memory,
        device_memory=device_memory,
        share=share,
        held=held,
    )
    return tier
