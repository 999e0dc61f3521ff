"""The defaults' policy: how many chunks ``mix="auto"`` holds, and on which tier.

One policy for every consumer that sizes a shuffle buffer without being told
(:class:`~chunkstream.BatchStream`, the reference trainer, ``chunkstream demo``,
``chunkstream train`` and ``chunkstream plan``): what decides model quality
is the share of the training split the buffer holds, so the default holds the
largest share the job's memory allows.

* **host tier**: :data:`HOST_SHARE` of what this rank's part of the job's host
  memory leaves beside everything else the library allocates (the loader's own
  arena, and what the caller names in ``held``: the batch sets, decode scratch),
  up to the chunks of one pass over the split. This rank's part is
  :attr:`~chunkstream._memory.NodeShare.host_bytes` (under a cgroup limit, the
  limit over the job's ranks on this node less what this process already
  holds; else ``MemAvailable`` over the ranks), read before the loader
  allocated its arena, so that arena is counted once. :func:`host_terms` lists
  every term;
* **device tier**: at most :data:`DEVICE_MIX` chunks, and no more than
  :data:`DEVICE_SHARE` of the device's memory;
* **the tier** is chosen in one place, :func:`~._buffer.choose_tier`,
  with these sizes.

The smallest working configuration is the loader's own arena and no buffer
(``mix=1``); where not even the loader's arena fits this rank's memory, the
loader itself raises a :class:`~chunkstream.ConfigError` naming the limit and
the fix, before it allocates.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .._text import format_bytes
from ._node import NodeShare, node_share

__all__ = [
    "DEVICE_MIX",
    "DEVICE_SHARE",
    "HOST_SHARE",
    "batch_sets_nbytes",
    "device_fit",
    "device_total_memory",
    "host_fit",
    "host_terms",
]

#: Of the host memory the job may use at start, the share ``mix="auto"`` gives the host
#: tier (the rest: the model, the page cache, the Python heap).
HOST_SHARE = 0.5
#: Chunks ``mix="auto"`` holds at most on the device tier.
DEVICE_MIX = 16
#: The most of the device's memory (CUDA: its total; CPU: this rank's host memory) the device tier takes.
DEVICE_SHARE = 1 / 8


def device_total_memory(device: torch.device) -> int:
    """Bytes of ``device``'s memory: a CUDA device's total, else this rank's part of the
    job's host memory (:attr:`~chunkstream._memory.NodeShare.host_bytes`)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return node_share().host_bytes


def host_fit(
    *,
    chunk_nbytes: int,
    pass_chunks: int,
    loader_nbytes: int,
    host_memory: int | None = None,
    share: NodeShare | None = None,
    held: Mapping[str, int] | None = None,
) -> tuple[int, str, str]:
    """``(chunks, why, memory line)`` of a host-tier buffer sized by the policy (module docs).

    ``host_memory``: a budget in bytes the caller gave (used as is); else
    :data:`HOST_SHARE` of what this rank's part of the job's memory (``share``,
    read before the loader allocated; :func:`node_share` when ``None``) leaves
    beside the loader's ``loader_nbytes`` and the bytes in ``held`` (what else the
    rank allocates, by name). At least 1 (no copy), at most ``pass_chunks``.
    """
    others = loader_nbytes + sum((held or {}).values())
    if host_memory is not None:
        budget = int(host_memory)
        where, line = f"host_memory={format_bytes(host_memory)}", ""
    else:
        share = node_share() if share is None else share
        line = share.describe()
        room = max(0, share.host_bytes - others)
        budget = int(room * HOST_SHARE)
        beside = "the loader's" if not held else "the loader's and the rest's"
        where = (
            f"{HOST_SHARE:.0%} of the {format_bytes(room, binary=True)} this rank's "
            f"{format_bytes(share.host_bytes, binary=True)} leave beside {beside} "
            f"{format_bytes(others, binary=True)}"
        )
    fit = max(1, min(pass_chunks, budget // max(1, chunk_nbytes)))
    why = (
        f'mix="auto": {fit} chunks of {format_bytes(chunk_nbytes)} in host memory '
        f"({where}; at most the {pass_chunks} chunks of one pass)"
    )
    return fit, why, line


def batch_sets(batch_prefetch: int, *, cuda: bool = False) -> int:
    """Buffer sets a stream's batch lane holds: those read ahead (at least one), the one
    being received, the one the user holds, and on CUDA one whose copy may still run."""
    return max(1, int(batch_prefetch)) + 2 + int(cuda)


def batch_sets_nbytes(batch_nbytes: int, batch_prefetch: int, *, cuda: bool = False) -> int:
    """Bytes of a stream's batch sets (:func:`batch_sets` of ``batch_nbytes`` each: a
    ``held`` term)."""
    return batch_sets(batch_prefetch, cuda=cuda) * int(batch_nbytes)


def host_terms(
    *,
    buffer_nbytes: int,
    loader_nbytes: int,
    held: Mapping[str, int] | None = None,
    share: NodeShare | None = None,
) -> tuple[tuple[str, int], ...]:
    """Every term of this rank's host memory, ``(what, bytes)``: what the process held
    when it sized (with ``share``), the loader's arena, each of ``held``, the shuffle
    buffer, and (with ``share``) what is left of the rank's part for the rest (the model,
    the Python heap, the page cache); a negative rest is an overcommit."""
    terms: list[tuple[str, int]] = []
    if share is not None:
        terms.append(("this process when it sized", share.process_bytes))
    terms.append(("the loader's arena", int(loader_nbytes)))
    terms += [(name, int(n)) for name, n in (held or {}).items() if n]  # what is held
    terms.append(("the shuffle buffer", int(buffer_nbytes)))
    if share is not None:
        used = sum(n for _, n in terms[1:])
        terms.append(("left for the model, the heap and the page cache", share.host_bytes - used))
    return tuple(terms)


def device_fit(
    *, chunk_nbytes: int, pass_chunks: int, device: torch.device, device_memory: int | None = None
) -> tuple[int, str]:
    """``(chunks, why)`` of a device-tier buffer: :data:`DEVICE_MIX` within :data:`DEVICE_SHARE`."""
    total = device_total_memory(device) if device_memory is None else int(device_memory)
    bound = int(total * DEVICE_SHARE)
    fit = max(1, min(DEVICE_MIX, pass_chunks, bound // max(1, chunk_nbytes)))
    why = (
        f'mix="auto": {fit} chunks of {format_bytes(chunk_nbytes)} on {device} (at most '
        f"{DEVICE_MIX}, within {DEVICE_SHARE:.3g} of its memory)"
    )
    return fit, why
