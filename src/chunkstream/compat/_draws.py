"""The original's window sequence: one ``random.Random(seed)`` draw per chunk it loaded."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ConfigError
from ..plans import SAMPLINGS, Layout, Plan

__all__ = ["Epoch", "OriginalDraws"]


class OriginalDraws(Plan):
    """A plan (one window a chunk, ``sampling="random"``) holding the original's draws.

    Draw ``k`` is the ``k``-th ``randint`` of ``random.Random(seed)`` (see the
    module docstring): the ``random`` mode's choice among the valid starts, from
    this stream instead of the hash. ``begin(epoch, draw)`` says that the loader's
    epoch ``epoch`` starts at draw ``draw``, so ``window(epoch, index)`` is draw
    ``draw + index``. Draws are made on demand, in order, under a lock; a
    registered draw never changes, so the answers are pure and thread-safe.
    ``seed`` (the plan's hash seed) is 0: the original's seed lives in its RNG.
    """

    seed = 0

    def __init__(self, total_timesteps: int, chunk_size: int, units: int, seed: Any) -> None:
        self.total_timesteps = total_timesteps
        self.chunk_size = chunk_size
        # The original's bound: the last start that fits, rounded down to ``units``.
        self.max_start = (max(0, total_timesteps - chunk_size) // units) * units
        try:
            self._rng = random.Random(seed)
        except TypeError as exc:
            raise ConfigError.bad(
                "seed", seed, "an int, str, bytes or None", "Pass an int seed, as the original."
            ) from exc
        self._draws: list[int] = []
        self._first: dict[int, int] = {}
        self._lock = threading.Lock()
        layout = Layout([(0, total_timesteps, 0)], piece=chunk_size, step=units)
        self._set_parts(layout, SAMPLINGS["random"], self)

    def begin(self, epoch: int, draw: int) -> None:
        self._first[epoch] = draw

    def draws(self, plan: Plan, epoch: int, index: np.ndarray, n: int) -> np.ndarray:
        """The stream: draw ``first + index`` of ``epoch``, each ``randint(0, n - 1)``
        (``n``: the valid starts, ``max_start // units + 1``)."""
        wanted = self._first[epoch] + index
        with self._lock:
            while len(self._draws) <= int(wanted.max(initial=-1)):
                self._draws.append(self._rng.randint(0, n - 1))
            chosen = [self._draws[k] for k in wanted.tolist()]
        return np.asarray(chosen, dtype=np.int64).reshape(-1, 1)


@dataclass
class Epoch:
    """One ``start_epoch`` call: its place in the draws and what it delivered."""

    index: int
    first_draw: int
    num_chunks: int
    delivered: int = 0
    loaded: int = 0  # load_fn calls for this epoch that returned
