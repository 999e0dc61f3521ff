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
from dataclasses import dataclass
from typing import Literal

import torch

from ._errors import ConfigError, check_int
from .plans import remaining_indices

__all__ = ["EpochShare", "Uneven", "epoch_share", "is_distributed", "resolve_rank"]

Uneven = Literal["exact", "pad", "drop"]
_UNEVEN = ("exact", "pad", "drop")


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
    check_int("rank", rank, 0, "Check the rank setup.", maximum=world_size - 1,
              expected=f"an integer in [0, world_size={world_size})")  # fmt: skip
    return rank, world_size


@dataclass(frozen=True, kw_only=True)
class EpochShare:
    """One rank's part of one epoch.

    ``indices`` are the global window indices this rank visits, in order;
    ``consumed`` and ``total`` the epoch's global windows delivered before the
    share starts and in all (``total`` as given, before any padding or dropping).
    """

    epoch: int
    consumed: int
    total: int
    rank: int
    world_size: int
    indices: range

    @property
    def first_step(self) -> int:
        """The per-rank step of the share's first window (``consumed // world_size``)."""
        return self.consumed // self.world_size

    def consumed_after(self, received: int) -> int:
        """Global windows delivered once every rank has received ``received`` of its share.

        This is what a checkpoint records: it is the same on every rank that has
        received the same count, and it is a valid ``consumed`` for any world size.
        """
        return min(self.total, self.consumed + received * self.world_size)


def epoch_share(
    *,
    epoch: int,
    consumed: int,
    total: int,
    rank: int,
    world_size: int,
    uneven: Uneven = "exact",
) -> EpochShare:
    """The global indices ``rank`` of ``world_size`` visits in what is left of an epoch.

    ``consumed`` windows of the epoch's ``total`` were delivered across all ranks
    (by any world size); see the module docs for ``uneven``.
    """
    if uneven not in _UNEVEN:
        raise ConfigError.bad(
            "uneven", uneven, f"one of {_UNEVEN}", "'exact' repeats and skips nothing."
        )
    exact = remaining_indices(consumed, total, rank, world_size)
    remainder = (total - consumed) % world_size
    end = total
    if uneven == "pad" and remainder:
        end = total + world_size - remainder
    elif uneven == "drop":
        end = total - remainder
    indices = range(exact.start, end, world_size) if exact.start < end else range(0)
    return EpochShare(
        epoch=epoch,
        consumed=consumed,
        total=total,
        rank=rank,
        world_size=world_size,
        indices=indices,
    )


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
