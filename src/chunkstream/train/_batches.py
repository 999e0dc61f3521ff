"""Which batches the trainer draws per chunk event: their seed and their window starts.

A batch's randomness is a pure function of ``(seed, epoch, chunk index, rank)``
(:func:`batch_seed`), so a resumed run draws the same batches and ranks, whose
chunk indices coincide, draw different ones. :func:`batch_starts` yields the
window starts of an event's batches, endlessly, from the mixer's table of the
held chunks' valid starts (none across a piece's end): uniform draws, or
permutation passes back to back (with ``mix=1`` the same draws as passes of a
:class:`~chunkstream.WindowSampler` over the chunk), so a pieced chunk, which
has fewer valid starts than a contiguous one, feeds as many batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..consumer import ChunkMixer
from ._config import TrainConfig

__all__ = ["batch_seed", "batch_starts"]


def batch_seed(seed: int, epoch: int, index: int, rank: int = 0) -> int:
    """The generator seed of chunk ``index``'s batches in ``epoch`` on ``rank``."""
    return (seed * 1_000_003 + epoch * 65_537 + index + rank * 4_294_967_311) % (2**63 - 1)


def _union_batches(
    table: torch.Tensor, batch_size: int, generator: torch.Generator, replacement: bool
) -> Iterator[torch.Tensor]:
    """Endless batches of starts from ``table``: uniform draws, or permutation passes."""
    n = int(table.numel())
    while True:
        if replacement:
            yield table[
                torch.randint(0, n, (batch_size,), generator=generator, device=table.device)
            ]
            continue
        perm = table[torch.randperm(n, generator=generator, device=table.device)]
        yield from perm.split(batch_size)


def batch_starts(
    mixer: ChunkMixer, config: TrainConfig, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Endless batches of window starts (int64 tensors on the mixer's device) for the
    event of the chunk last added to ``mixer``."""
    return _union_batches(mixer.starts(), config.batch_size, generator, config.replacement)
