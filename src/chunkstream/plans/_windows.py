"""Window plans: which ``[start, stop)`` windows an epoch visits, as pure functions.

A plan answers ``window(epoch, index)`` for a *global* window index, counted across
all ranks. The answer depends only on ``(seed, epoch, index)`` and the plan's
sizes: there is no RNG state to advance, so determinism (same seed, same
windows, whatever the number of reader workers), resume (a checkpoint is a few
integers) and sharding (rank ``r`` of ``W`` takes the indices ``step * W + r``)
all follow from the function itself.

Randomness comes from a counter-based hash (the splitmix64 finaliser chained
over ``seed, tag, epoch, index``), written once with operators that behave the
same on Python ints and on ``uint64`` numpy arrays, so the scalar path (a few
µs, called per chunk) and the vectorised path agree bit for bit.

The three plans and their trade-offs:

* :class:`RandomPlan` -- start uniform over the multiples of ``align`` in
  ``[0, T - chunk_size]``, drawn with replacement. The original behaviour: no
  coverage guarantee, some timesteps are seen twice and others not at all in a
  pass.
* :class:`ShuffledPlan` -- ``K = T // chunk_size`` tiles per pass, shifted by a
  random phase in ``[0, T - K * chunk_size]`` and visited in a random order. Each
  tile is used exactly once per pass and no timestep twice; the ``T mod
  chunk_size`` timesteps outside the tiles move with the phase, so every
  timestep is reachable across passes. The permutation is a keyed Feistel
  network with cycle walking, O(1) per index and with no table, so ``K`` may
  be in the millions.
* :class:`SequentialPlan` -- tiles ``0, c, 2c, ...`` in order, the last one
  shorter, covering all of ``[0, T)``; for evaluation. Ignores ``seed`` and
  ``align``.

When ``chunk_size >= total_timesteps`` every plan returns the whole data
``(0, T)`` for every index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .._errors import ConfigError, check_int
from ._hash import feistel as _feistel
from ._hash import half_bits as _half_bits
from ._hash import hash_words as _hash
from ._hash import mix as _mix
from ._hash import round_keys as _round_keys
from ._hash import seed_key as _seed_key

__all__ = [
    "RandomPlan",
    "SequentialPlan",
    "ShuffledPlan",
    "WindowPlan",
    "make_plan",
    "remaining_indices",
]

_MAX_INDEX = 2**63 - 1  # the vectorised path holds indices in int64
_TAG_RANDOM = 0x52414E44  # "RAND": separates the random and shuffled streams
_TAG_SHUFFLE = 0x53485546  # "SHUF"


@runtime_checkable
class WindowPlan(Protocol):
    """Which windows an epoch visits.

    Contract for implementations:

    * **Pure and deterministic.** ``window(epoch, index)`` depends only on the
      plan's fields and its arguments; calling it never changes anything, and
      calls may come in any order.
    * **Thread-safe.** Reader workers call it concurrently.
    * ``index`` is a global index counted across all ranks; ``rank_window(epoch,
      step, rank, world_size)`` is ``window(epoch, step * world_size + rank)``.
    * Every window satisfies ``0 <= start < stop <= total_timesteps`` and
      ``stop - start <= chunk_size`` (so buffers of ``min(chunk_size,
      total_timesteps)`` rows hold any window).
    * ``windows(epoch, indices)`` is the vectorised form: an ``(k, 2)`` int64
      array equal row by row to ``window``.
    * ``windows_per_pass`` is the number of indices in one pass over the data,
      or ``None`` when the plan has no passes (sampling with replacement).
    """

    total_timesteps: int
    chunk_size: int

    @property
    def windows_per_pass(self) -> int | None: ...

    def window(self, epoch: int, index: int) -> tuple[int, int]: ...

    def windows(self, epoch: int, indices: np.ndarray) -> np.ndarray: ...

    def rank_window(
        self, epoch: int, step: int, rank: int = 0, world_size: int = 1
    ) -> tuple[int, int]: ...


# -- validation ---------------------------------------------------------------------


def _span(total_timesteps: object, chunk_size: object) -> tuple[int, int]:
    """A plan's ``(total_timesteps, chunk_size)`` as Python ints >= 1, else ConfigError."""
    total = check_int("total_timesteps", total_timesteps, 1, "The source must hold data.", numpy=True)
    chunk = check_int("chunk_size", chunk_size, 1, "Pass a positive chunk_size.", numpy=True)
    return total, chunk


def _index(name: str, value: object) -> int:
    result = check_int(name, value, 0, f"Pass a non-negative {name}.", numpy=True)
    if result > _MAX_INDEX:
        raise ConfigError.bad(name, value, f"at most {_MAX_INDEX}", f"Pass a smaller {name}.")
    return result


def _index_array(indices: object) -> np.ndarray:
    """``indices`` as a 1-D int64 array of valid window indices."""
    array = np.asarray(indices)
    if array.ndim != 1:
        raise ConfigError.bad(
            "indices", f"<array of shape {array.shape}>", "a 1-D array", "Flatten it first."
        )
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise ConfigError.bad(
            "indices", f"<array of dtype {array.dtype}>", "an integer array", "Cast it to int64."
        )
    if np.issubdtype(array.dtype, np.signedinteger) and int(array.min()) < 0:
        raise ConfigError.bad(
            "indices", int(array.min()), "non-negative indices", "Drop the negative entries."
        )
    if int(array.max()) > _MAX_INDEX:
        raise ConfigError.bad("indices", int(array.max()), f"indices <= {_MAX_INDEX}")
    return array.astype(np.int64, copy=False)


# -- the plans ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _PlanBase:
    """Fields, validation and the rank split shared by the three plans."""

    total_timesteps: int
    chunk_size: int
    align: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        # Frozen: normalise numpy ints to Python ints so the scalar path stays exact.
        total, chunk = _span(self.total_timesteps, self.chunk_size)
        align = check_int("align", self.align, 1, "Use align=1 for no alignment.", numpy=True)
        seed = check_int("seed", self.seed, 0, "Pass a non-negative int seed.", numpy=True)
        for name, value in (
            ("total_timesteps", total),
            ("chunk_size", chunk),
            ("align", align),
            ("seed", seed),
        ):
            object.__setattr__(self, name, value)
        if chunk < total and align > total - chunk + 1:
            raise ConfigError.bad(
                "align",
                align,
                f"at most total_timesteps - chunk_size + 1 = {total - chunk + 1}",
                "Lower align or chunk_size.",
            )

    @property
    def _whole(self) -> bool:
        return self.chunk_size >= self.total_timesteps

    @property
    def windows_per_pass(self) -> int | None:
        raise NotImplementedError

    def window(self, epoch: int, index: int) -> tuple[int, int]:
        """The ``index``-th window (global, across ranks) of ``epoch``, as (start, stop)."""
        epoch = _index("epoch", epoch)
        index = _index("index", index)
        if self._whole:
            return 0, self.total_timesteps
        return self._window(epoch, index)

    def windows(self, epoch: int, indices: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`window`: a ``(len(indices), 2)`` int64 array of (start, stop)."""
        epoch = _index("epoch", epoch)
        idx = _index_array(indices)
        if self._whole:
            out = np.empty((idx.size, 2), dtype=np.int64)
            out[:, 0], out[:, 1] = 0, self.total_timesteps
            return out
        return self._windows(epoch, idx)

    def rank_window(
        self, epoch: int, step: int, rank: int = 0, world_size: int = 1
    ) -> tuple[int, int]:
        """Window ``step`` of ``rank`` out of ``world_size``: ``window(epoch, step * W + rank)``.

        Ranks get disjoint global indices and, for the same number of steps, equal counts.
        """
        world_size = check_int(
            "world_size", world_size, 1, "Pass the number of ranks (>= 1).", numpy=True
        )
        rank = check_int("rank", rank, 0, f"Pass a rank in [0, world_size={world_size}).",
                         maximum=world_size - 1, numpy=True)  # fmt: skip
        step = _index("step", step)
        return self.window(epoch, step * world_size + rank)

    def _window(self, epoch: int, index: int) -> tuple[int, int]:
        raise NotImplementedError

    def _windows(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _pack(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        return np.stack([starts.astype(np.int64), stops.astype(np.int64)], axis=1)


@dataclass(frozen=True, kw_only=True)
class RandomPlan(_PlanBase):
    """Start uniform over the multiples of ``align`` in ``[0, T - chunk_size]``, with
    replacement (the original behaviour). ``windows_per_pass`` is ``None``."""

    @property
    def windows_per_pass(self) -> int | None:
        return None

    @property
    def _n_starts(self) -> int:
        return (self.total_timesteps - self.chunk_size) // self.align + 1

    def _window(self, epoch: int, index: int) -> tuple[int, int]:
        h = _hash(_seed_key(self.seed), _TAG_RANDOM, epoch, index)
        start = (h % self._n_starts) * self.align
        return start, start + self.chunk_size

    def _windows(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        h = _hash(_seed_key(self.seed), _TAG_RANDOM, epoch, idx.astype(np.uint64))
        starts = (h % np.uint64(self._n_starts)).astype(np.int64) * self.align
        return self._pack(starts, starts + self.chunk_size)


@dataclass(frozen=True, kw_only=True)
class ShuffledPlan(_PlanBase):
    """Tiles of ``chunk_size`` after a random phase, in a random order per pass.

    Pass ``index // K`` of ``epoch`` draws a phase ``p`` (a multiple of ``align``
    in ``[0, T - K * chunk_size]``) and a permutation of the ``K = T //
    chunk_size`` tiles; index ``i`` maps to ``p + perm[i % K] * chunk_size``.
    Requires ``chunk_size % align == 0`` so every start is aligned.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self._whole and self.chunk_size % self.align:
            lower = self.chunk_size - self.chunk_size % self.align
            raise ConfigError(
                f"chunk_size={self.chunk_size} is not a multiple of align={self.align}: "
                "shuffled tiles must all start on an aligned timestep. Use a chunk_size "
                f"that is a multiple of align (e.g. {max(lower, self.align)}), an align "
                "that divides chunk_size, or sampling='random'."
            )

    @property
    def windows_per_pass(self) -> int:
        return max(1, self.total_timesteps // self.chunk_size)

    def _geometry(self) -> tuple[int, int, int]:
        tiles = self.total_timesteps // self.chunk_size
        n_phases = (self.total_timesteps - tiles * self.chunk_size) // self.align + 1
        return tiles, n_phases, _half_bits(tiles)

    def _window(self, epoch: int, index: int) -> tuple[int, int]:
        tiles, n_phases, half_bits = self._geometry()
        base = _hash(_seed_key(self.seed), _TAG_SHUFFLE, epoch, index // tiles)
        tile = index % tiles
        if tiles > 1:
            keys = _round_keys(base)
            tile = _feistel(tile, half_bits, keys)
            while tile >= tiles:  # cycle walking: at most a few steps on average (< 4)
                tile = _feistel(tile, half_bits, keys)
        start = (_mix(base) % n_phases) * self.align + tile * self.chunk_size
        return start, start + self.chunk_size

    def _windows(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        tiles, n_phases, half_bits = self._geometry()
        passes = (idx // tiles).astype(np.uint64)
        base = _hash(_seed_key(self.seed), _TAG_SHUFFLE, epoch, passes)
        tile = (idx % tiles).astype(np.uint64)
        if tiles > 1:
            keys = _round_keys(base)
            tile = _feistel(tile, half_bits, keys)
            out = np.flatnonzero(tile >= tiles)
            while out.size:
                tile[out] = _feistel(tile[out], half_bits, [k[out] for k in keys])
                out = out[tile[out] >= tiles]
        phase = (_mix(base) % np.uint64(n_phases)).astype(np.int64) * self.align
        starts = phase + tile.astype(np.int64) * self.chunk_size
        return self._pack(starts, starts + self.chunk_size)


@dataclass(frozen=True, kw_only=True)
class SequentialPlan(_PlanBase):
    """Tiles ``0, c, 2c, ...`` in order, the last one ending at ``T`` (so shorter when
    ``c`` does not divide ``T``); index ``i`` is tile ``i % ceil(T / c)``. Ignores
    ``seed`` and ``align``."""

    @property
    def windows_per_pass(self) -> int:
        return -(-self.total_timesteps // self.chunk_size)

    def _window(self, epoch: int, index: int) -> tuple[int, int]:
        start = (index % self.windows_per_pass) * self.chunk_size
        return start, min(start + self.chunk_size, self.total_timesteps)

    def _windows(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        starts = (idx % self.windows_per_pass) * self.chunk_size
        return self._pack(starts, np.minimum(starts + self.chunk_size, self.total_timesteps))


_PLANS: dict[str, type[_PlanBase]] = {
    "random": RandomPlan,
    "shuffled": ShuffledPlan,
    "sequential": SequentialPlan,
}


def make_plan(
    sampling: str | WindowPlan,
    *,
    total_timesteps: int,
    chunk_size: int,
    align: int = 1,
    seed: int = 0,
) -> WindowPlan:
    """The plan named ``sampling`` ("random", "shuffled" or "sequential").

    A :class:`WindowPlan` instance is returned as it is, after checking that its
    ``total_timesteps`` and ``chunk_size`` match the ones given.
    """
    if isinstance(sampling, WindowPlan):
        for name, given in (("total_timesteps", total_timesteps), ("chunk_size", chunk_size)):
            if getattr(sampling, name) != given:
                raise ConfigError.bad(
                    name,
                    given,
                    f"{getattr(sampling, name)} as in the plan passed as sampling",
                    "Build the plan with the loader's sizes.",
                )
        return sampling
    try:
        cls = _PLANS[sampling]
    except (KeyError, TypeError):
        raise ConfigError.bad(
            "sampling",
            sampling,
            f"one of {', '.join(map(repr, _PLANS))} or a WindowPlan",
            "'random' is the original behaviour; 'shuffled' covers every timestep once per pass.",
        ) from None
    return cls(total_timesteps=total_timesteps, chunk_size=chunk_size, align=align, seed=seed)


def remaining_indices(consumed_global: int, total_global: int, rank: int, world_size: int) -> range:
    """The global indices ``rank`` still visits in an epoch of ``total_global`` windows
    after ``consumed_global`` were delivered across all ranks.

    Rank ``r`` gets ``consumed + r, consumed + r + W, ...`` below ``total_global``: over
    all ranks this covers every remaining index exactly once, and the counts differ
    by at most one. ``world_size`` may differ from the one that consumed the first
    part (elastic resume). When ``consumed_global`` is a multiple of ``W`` this is the
    continuation of :meth:`WindowPlan.rank_window` at ``step = consumed_global // W``.
    """
    world_size = check_int(
        "world_size", world_size, 1, "Pass the number of ranks (>= 1).", numpy=True
    )
    rank = check_int("rank", rank, 0, f"Pass a rank in [0, world_size={world_size}).",
                     maximum=world_size - 1, numpy=True)  # fmt: skip
    total_global = check_int(
        "total_global", total_global, 0, "Pass the epoch's window count.", numpy=True
    )
    consumed_global = check_int(
        "consumed_global", consumed_global, 0, "Pass the count delivered.", numpy=True
    )
    if consumed_global > total_global:
        raise ConfigError.bad(
            "consumed_global",
            consumed_global,
            f"at most total_global={total_global}",
            "The checkpoint belongs to a longer epoch; pass its epoch length.",
        )
    return range(consumed_global + rank, total_global, world_size)
