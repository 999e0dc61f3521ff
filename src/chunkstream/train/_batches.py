"""Which batches the trainer draws per chunk event: their seed and their window starts.

A batch's randomness is a pure function of ``(seed, epoch, chunk index, rank)``
(:func:`batch_seed`), so a resumed run draws the same batches and ranks, whose
chunk indices coincide, draw different ones. :func:`batch_starts` yields the
window starts of an event's batches, endlessly: with ``mix=1`` passes of a
:class:`~chunkstream.WindowSampler` over the held chunk (none across a piece's
end); with ``mix > 1`` draws from the union of the mixed chunks' valid starts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from ..consumer import ChunkMixer, WindowSampler
from ..pipeline import Chunk
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
            yield table[torch.randint(0, n, (batch_size,), generator=generator,
                                      device=table.device)]  # fmt: skip
            continue
        perm = table[torch.randperm(n, generator=generator, device=table.device)]
        yield from perm.split(batch_size)


def batch_starts(
    chunk: Chunk, mixer: ChunkMixer, config: TrainConfig, generator: torch.Generator,
    device: torch.device,
) -> Iterator[torch.Tensor]:  # fmt: skip
    """Endless batches of window starts (int64 tensors on ``device``) for ``chunk``'s event."""
    c = config
    if mixer.mix > 1:  # the trainer's resolved mix (config.mix may be "auto")
        return _union_batches(mixer.starts(), c.batch_size, generator, c.replacement)
    sampler = WindowSampler(
        chunk.length, c.window, c.batch_size, generator, replacement=c.replacement,
        device=device, pieces=chunk.pieces,
    )  # fmt: skip
    # Passes of the sampler back to back: a pieced chunk has fewer valid starts
    # than a contiguous one (none across piece ends), yet feeds as many batches.
    return itertools.chain.from_iterable(itertools.repeat(sampler))
