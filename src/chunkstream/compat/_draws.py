"""The original's window sequence: one ``random.Random(seed)`` draw per chunk it loaded."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ConfigError

__all__ = ["Epoch", "OriginalDraws"]


class OriginalDraws:
    """A :class:`~chunkstream.WindowPlan` holding the original's window sequence.

    Draw ``k`` is the ``k``-th ``randint`` of ``random.Random(seed)`` (see the
    module docstring); ``begin(epoch, draw)`` says that the loader's epoch
    ``epoch`` starts at draw ``draw``, so ``window(epoch, index)`` is draw
    ``draw + index``. Draws are made on demand, in order, under a lock; a
    registered window never changes, so the answers are pure and thread-safe.
    """

    windows_per_pass = None  # drawn with replacement: no natural pass

    def __init__(self, total_timesteps: int, chunk_size: int, units: int, seed: Any) -> None:
        self.total_timesteps = total_timesteps
        self.chunk_size = chunk_size
        # The original's bound: the last start that fits, rounded down to ``units``.
        self.max_start = (max(0, total_timesteps - chunk_size) // units) * units
        self._units = units
        try:
            self._rng = random.Random(seed)
        except TypeError as exc:
            raise ConfigError.bad(
                "seed", seed, "an int, str, bytes or None", "Pass an int seed, as the original."
            ) from exc
        self._starts: list[int] = []
        self._first: dict[int, int] = {}
        self._lock = threading.Lock()

    def begin(self, epoch: int, draw: int) -> None:
        self._first[epoch] = draw

    def draw(self, k: int) -> tuple[int, int]:
        """The window of draw ``k`` (drawing up to it if needed)."""
        with self._lock:
            while len(self._starts) <= k:
                self._starts.append(self._rng.randint(0, self.max_start // self._units) * self._units)
            start = self._starts[k]
        return start, min(start + self.chunk_size, self.total_timesteps)

    def window(self, epoch: int, index: int) -> tuple[int, int]:
        return self.draw(self._first[epoch] + index)

    def windows(self, epoch: int, indices: np.ndarray) -> np.ndarray:
        rows = [self.window(epoch, int(i)) for i in np.asarray(indices).reshape(-1)]
        return np.asarray(rows, dtype=np.int64).reshape(-1, 2)

    def rank_window(
        self, epoch: int, step: int, rank: int = 0, world_size: int = 1
    ) -> tuple[int, int]:
        return self.window(epoch, step * world_size + rank)


@dataclass
class Epoch:
    """One ``start_epoch`` call: its place in the draws and what it delivered."""

    index: int
    first_draw: int
    num_chunks: int
    delivered: int = 0
    loaded: int = 0  # load_fn calls for this epoch that returned
