"""Ranks, world sizes and each rank's share of an epoch (torch.distributed, elastic resume).

An epoch is a range of *global* window indices ``[0, total)`` of a pure plan
(:mod:`chunkstream.plans`). Rank ``r`` of ``W`` visits ``consumed + r,
consumed + r + W, ...``: the ranks' shares are disjoint, together they cover
the range once, and in an epoch started from scratch (``consumed = 0``,
``total = n * W``) every rank gets exactly ``n`` windows.

**Elastic resume.** A checkpoint records the epoch's global length ``total``
and the global windows delivered, ``consumed``: taken when every rank has
received the same count (DDP keeps ranks in lockstep), the delivered windows
are exactly the indices ``[0, consumed)``. Resumed with ``W'`` ranks,
the remaining ``total - consumed`` indices are re-split by the rule above, so no
window is repeated or skipped. When ``W'`` does not divide the remainder the
counts differ by one: ranks ``r < (total - consumed) % W'`` get one window
more. A DDP loop must then tolerate uneven inputs (``with model.join(): ...``,
see ``torch.distributed.algorithms.Join``), or pick another ``uneven`` policy:

* ``"exact"`` (default) -- every remaining window once; counts differ by <= 1;
* ``"pad"`` -- the short ranks take the plan's next windows past the epoch's end
  (indices ``>= total``), so counts are equal and every remaining window is still
  visited; up to ``W' - 1`` extra windows are seen;
* ``"drop"`` -- the last ``(total - consumed) % W'`` windows are skipped, so
  counts are equal.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch

from ._errors import check_int
from .plans import EpochShare, Uneven, epoch_share

__all__ = ["EpochShare", "Uneven", "epoch_share", "is_distributed", "resolve_rank"]


def is_distributed() -> bool:
    """Whether torch.distributed is available and a process group is initialised."""
    import torch

    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, else torch.distributed's, else ``(0, 1)``.

    Either value may be given alone; the other then comes from the process group
    when one is initialised. Raises :class:`ConfigError` for a world size below 1
    or a rank outside ``[0, world_size)``.
    """
    if (rank is None or world_size is None) and is_distributed():
        import torch

        dist = torch.distributed
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    check_int("world_size", world_size, 1, "Pass the number of ranks.")
    check_int(
        "rank",
        rank,
        0,
        "Check the rank setup.",
        maximum=world_size - 1,
        expected=f"an integer in [0, world_size={world_size})",
    )
    return rank, world_size


def warn_if_not_local_rank(
    requested: str | torch.device | None, resolved: torch.device, env: Mapping[str, str]
) -> None:
    """Warn when, under torchrun (``LOCAL_RANK`` set, ``WORLD_SIZE`` > 1), a device without
    an index resolved to another GPU than this rank's. The index is kept: the user's
    model, moved with ``"cuda"`` too, is on the current device as well."""
    if resolved.type != "cuda" or "LOCAL_RANK" not in env:
        return
    if requested is not None and torch.device(requested).index is not None:
        return  # an explicit index is the user's choice
    try:
        local, world = int(env["LOCAL_RANK"]), int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return
    if world > 1 and resolved.index != local:
        warnings.warn(
            f"chunkstream: device={requested!r} resolved to {resolved} (the current CUDA "
            f"device), but this process is LOCAL_RANK={local} of WORLD_SIZE={world}, so "
            f'every rank may stream to {resolved}. Pass device=f"cuda:{{local_rank}}" '
            "(LOCAL_RANK), or call torch.cuda.set_device(local_rank) before creating the "
            "loader (and the model).",
            RuntimeWarning,
            stacklevel=3,
        )
