"""The defaults' policy: how many chunks ``mix="auto"`` holds, and on which tier.

One policy for every consumer that sizes a shuffle buffer without being told
(:class:`~chunkstream.BatchStream`, the reference trainer, ``chunkstream demo``,
``chunkstream train`` and ``chunkstream plan``): what decides model quality
is the share of the training split the buffer holds, so the default holds the
largest share the job's memory allows.

* **host tier**: :data:`HOST_SHARE` of the host memory the job may use
  (:func:`~chunkstream._memory.job_memory`: ``MemAvailable`` or the room
  under the job's cgroup limit, whichever is smaller), less the loader's own
  arena, up to the chunks of one pass over the split;
* **device tier**: at most :data:`DEVICE_MIX` chunks, and no more than
  :data:`DEVICE_SHARE` of the device's memory;
* **the tier**: with batches going to a CUDA device, the host tier where it
  holds more chunks than the device tier may (each batch then costs a host
  gather and one host-to-device copy of the batch), else the device tier. On
  the CPU both are host memory and the host tier is taken.

The smallest working configuration is the loader's own arena and no buffer
(``mix=1``); where not even the loader's arena fits the job's memory,
:func:`host_fit` raises a :class:`~chunkstream.ConfigError` naming the limit
and the fix, before anything is allocated.
"""

from __future__ import annotations

import os

import torch

from .._errors import ConfigError
from .._memory import JobMemory, job_memory

__all__ = [
    "DEVICE_MIX",
    "DEVICE_SHARE",
    "HOST_SHARE",
    "default_buffer",
    "device_fit",
    "device_total_memory",
    "host_fit",
    "host_tier_hint",
    "preferred_tier",
]

#: Of the host memory the job may use at start, the share ``mix="auto"`` gives the host
#: tier (the rest: the model, the page cache, the Python heap).
HOST_SHARE = 0.5
#: Chunks ``mix="auto"`` holds at most on the device tier.
DEVICE_MIX = 16
#: The most of the device's memory (CUDA: its total; CPU: physical RAM) the device tier takes.
DEVICE_SHARE = 1 / 8


def device_total_memory(device: torch.device) -> int:
    """Bytes of ``device``'s memory: a CUDA device's total, else the host's physical RAM."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def host_fit(
    *,
    chunk_nbytes: int,
    pass_chunks: int,
    loader_nbytes: int,
    host_memory: int | None = None,
    memory: JobMemory | None = None,
) -> tuple[int, str, str]:
    """``(chunks, why, memory line)`` of a host-tier buffer sized by the policy (module docs).

    ``host_memory``: a budget in bytes the caller gave (used as is); else
    :data:`HOST_SHARE` of ``memory`` (:func:`job_memory` when ``None``) less
    ``loader_nbytes``. At least 1 (no copy), at most ``pass_chunks``.
    """
    if host_memory is not None:
        budget = int(host_memory)
        where, line = f"host_memory={host_memory / 1e9:.3g} GB", ""
    else:
        memory = job_memory() if memory is None else memory
        line = memory.describe()
        if memory.available < loader_nbytes:
            raise ConfigError(
                f"the loader's host buffers ({loader_nbytes / 2**30:.3g} GiB) do not fit the "
                f"memory this job may use: {line}. Lower chunk_size, prefetch or workers, or "
                "run the job with a larger memory limit."
            )
        budget = int(memory.available * HOST_SHARE) - loader_nbytes
        where = (
            f"{HOST_SHARE:.0%} of the job's {memory.available / 2**30:.3g} GiB, less the "
            f"loader's {loader_nbytes / 2**30:.3g} GiB"
        )
    fit = max(1, min(pass_chunks, budget // max(1, chunk_nbytes)))
    why = (
        f'mix="auto": {fit} chunks of {chunk_nbytes / 1e6:.3g} MB in host memory '
        f"({where}; at most the {pass_chunks} chunks of one pass)"
    )
    return fit, why, line


def device_fit(
    *, chunk_nbytes: int, pass_chunks: int, device: torch.device, device_memory: int | None = None
) -> tuple[int, str]:
    """``(chunks, why)`` of a device-tier buffer: :data:`DEVICE_MIX` within :data:`DEVICE_SHARE`."""
    total = device_total_memory(device) if device_memory is None else int(device_memory)
    bound = int(total * DEVICE_SHARE)
    fit = max(1, min(DEVICE_MIX, pass_chunks, bound // max(1, chunk_nbytes)))
    why = (
        f'mix="auto": {fit} chunks of {chunk_nbytes / 1e6:.3g} MB on {device} (at most '
        f"{DEVICE_MIX}, within {DEVICE_SHARE:.3g} of its memory)"
    )
    return fit, why


def preferred_tier(
    device: torch.device,
    *,
    chunk_nbytes: int,
    pass_chunks: int,
    loader_nbytes: int,
    host_memory: int | None = None,
    device_memory: int | None = None,
    memory: JobMemory | None = None,
) -> tuple[str, str]:
    """``(tier, why)`` the defaults take for batches on ``device`` (module docs)."""
    if device.type != "cuda":
        return "host", "batches on the CPU: the buffer is host memory"
    on_host, _, _ = host_fit(
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        loader_nbytes=loader_nbytes,
        host_memory=host_memory,
        memory=memory,
    )
    on_device, _ = device_fit(
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        device=device,
        device_memory=device_memory,
    )
    if on_host > on_device:
        return "host", (
            f"the host holds {on_host} chunks where the device tier may hold {on_device}: "
            f"batches gathered on the host, each copied to {device}"
        )
    return "device", f"the device tier holds {on_device} chunks, the host no more"


def default_buffer(
    mix: object,
    *,
    device: torch.device,
    chunk_nbytes: int,
    pass_chunks: int,
    pieces: int,
    loader_nbytes: int,
    host_memory: int | None = None,
    device_memory: int | None = None,
    tier: str = "auto",
):
    """The :class:`~chunkstream.consumer.BufferInfo` a consumer that builds its own loader
    (the reference trainer) holds for batches on ``device``: ``mix="auto"`` on the tier
    :func:`preferred_tier` picks; an int on the device tier with a CUDA device (the host
    tier on the CPU). ``tier`` (``"host"`` or ``"device"``, as ``BatchStream(buffer=)``)
    overrides that choice."""
    from ._tiers import plan_buffer  # _tiers sizes "auto" with this module's functions

    if tier != "auto":
        why = f"buffer={tier!r} given"
    elif mix == "auto":
        tier, why = preferred_tier(
            device,
            chunk_nbytes=chunk_nbytes,
            pass_chunks=pass_chunks,
            loader_nbytes=loader_nbytes,
            host_memory=host_memory,
            device_memory=device_memory,
        )
    else:
        tier = "device" if device.type == "cuda" else "host"
        why = (
            f"mix={mix} given, held {'on ' + str(device) if tier == 'device' else 'in host memory'}"
        )
    return plan_buffer(
        mix,
        tier,
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        pieces=pieces,
        device=device,
        host_memory=host_memory,
        loader_nbytes=loader_nbytes,
        device_memory=device_memory,
        why=why,
    )


def host_tier_hint(info, device: torch.device) -> str:
    """What a CUDA loader's device-tier default would gain on the host tier (one log line):
    a ``BatchStream`` cannot move its loader, so the defaults' rule is said, not applied."""
    chunk = info.nbytes // info.mix if info.mix > 1 else 0
    if not chunk or info.split_share >= 1.0:
        return f"shuffle buffer: the device tier holds {info.split_share:.1%} of the split"
    pass_chunks = max(1, round(info.mix / info.split_share))
    on_host, _, line = host_fit(chunk_nbytes=chunk, pass_chunks=pass_chunks, loader_nbytes=0)
    if on_host <= info.mix:
        return f"shuffle buffer: the device tier holds {info.split_share:.1%} of the split"
    return (
        f"shuffle buffer: the device tier holds {info.split_share:.1%} of the split; the host "
        f"tier would hold {min(1.0, on_host / pass_chunks):.1%} ({line}). For it, build the "
        f"loader with device='cpu' and pass BatchStream(device='{device}'): each batch then "
        "costs a host gather and one copy to the device"
    )
