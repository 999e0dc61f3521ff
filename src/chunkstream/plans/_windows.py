"""Window plans: which ``[start, stop)`` windows an epoch visits, as pure functions.

A plan answers ``window(epoch, index)`` for a *global* window index, counted across
all ranks. The answer depends only on ``(seed, epoch, index)`` and the plan's
sizes: there is no RNG state to advance, so determinism (same seed, same
windows, whatever the number of reader workers), resume (a checkpoint is a few
integers) and sharding (rank ``r`` of ``W`` takes the indices ``step * W + r``)
all follow from the function itself.

Randomness comes from a counter-based hash (the splitmix64 finaliser chained
over ``seed, tag, epoch, index``). A window plan is a
:class:`~chunkstream.plans._plan.Plan` of one piece a chunk: its modes are the
piece plans' (:mod:`~chunkstream.plans._sampling`), computed for many indices
at once; ``window(epoch, index)`` is the one-index case (a few hundred µs: the
loader draws an epoch's windows in one call).

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
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from .._errors import ConfigError, check_int
from ._plan import Draw, Layout, Plan, check_rank
from ._sampling import WINDOW_STREAM, Sampling, as_mode

__all__ = [
    "RandomPlan",
    "SequentialPlan",
    "ShuffledPlan",
    "WindowPlan",
    "make_plan",
    "remaining_indices",
]


def window_in_chunk(window: int, length: int) -> int:
    """``window`` if a chunk of ``length`` timesteps holds it, else the one "window
    longer than the chunk" error (the loader's, the stream's and the sampler's)."""
    if window > length:
        raise ConfigError.bad(
            "window",
            window,
            f"at most the chunk length {length}",
            "Use a larger chunk_size or a shorter window (time_units * evolve_multiple_steps).",
        )
    return window


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

    The built-in plans are :class:`~chunkstream.plans._plan.Plan` instances (one
    piece a chunk); a loader wraps any other implementation in one.
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


def _span(total_timesteps: object, chunk_size: object) -> tuple[int, int]:
    """A plan's ``(total_timesteps, chunk_size)`` as Python ints >= 1, else ConfigError."""
    total = check_int(
        "total_timesteps", total_timesteps, 1, "The source must hold data.", numpy=True
    )
    chunk = check_int("chunk_size", chunk_size, 1, "Pass a positive chunk_size.", numpy=True)
    return total, chunk


# -- the plans ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _PlanBase(Plan):
    """Fields and validation shared by the three window plans: one segment ``[0, T)``,
    one piece of ``chunk_size`` a chunk, starts aligned to ``align``."""

    total_timesteps: int
    chunk_size: int
    align: int = 1
    seed: int = 0
    sampling: ClassVar[str]

    def __post_init__(self) -> None:
        # Frozen: normalise numpy ints to Python ints so the answers stay exact.
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
        layout = Layout([(0, total, 0)], piece=chunk, step=align)
        self._set_parts(layout, as_mode(self.sampling), WINDOW_STREAM)


@dataclass(frozen=True, kw_only=True)
class RandomPlan(_PlanBase):
    """Start uniform over the multiples of ``align`` in ``[0, T - chunk_size]``, with
    replacement (the original behaviour). ``windows_per_pass`` is ``None``."""

    sampling: ClassVar[str] = "random"


@dataclass(frozen=True, kw_only=True)
class ShuffledPlan(_PlanBase):
    """Tiles of ``chunk_size`` after a random phase, in a random order per pass.

    Pass ``index // K`` of ``epoch`` draws a phase ``p`` (a multiple of ``align``
    in ``[0, T - K * chunk_size]``) and a permutation of the ``K = T //
    chunk_size`` tiles; index ``i`` maps to ``p + perm[i % K] * chunk_size``.
    Requires ``chunk_size % align == 0`` so every start is aligned.
    """

    sampling: ClassVar[str] = "shuffled"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size < self.total_timesteps and self.chunk_size % self.align:
            lower = self.chunk_size - self.chunk_size % self.align
            raise ConfigError(
                f"chunk_size={self.chunk_size} is not a multiple of align={self.align}: "
                "shuffled tiles must all start on an aligned timestep. Use a chunk_size "
                f"that is a multiple of align (e.g. {max(lower, self.align)}), an align "
                "that divides chunk_size, or sampling='random'."
            )


@dataclass(frozen=True, kw_only=True)
class SequentialPlan(_PlanBase):
    """Tiles ``0, c, 2c, ...`` in order, the last one ending at ``T`` (so shorter when
    ``c`` does not divide ``T``); index ``i`` is tile ``i % ceil(T / c)``. Ignores
    ``seed`` and ``align``."""

    sampling: ClassVar[str] = "sequential"


@dataclass(frozen=True, kw_only=True)
class ModePlan(_PlanBase):
    """The windows of any :class:`~chunkstream.plans._sampling.Sampling` mode (what
    :func:`make_plan` returns for one), and of a custom :class:`WindowPlan` (see :func:`as_plan`)."""

    sampling: Sampling  # type: ignore[misc]


class _Given(Sampling):
    """A custom :class:`WindowPlan` as a mode: chunk ``i`` is its ``window(epoch, i)``."""

    def __init__(self, plan: WindowPlan) -> None:
        self.plan = plan
        self.name = type(plan).__name__

    def per_pass(self, plan: Plan) -> int | None:
        return self.plan.windows_per_pass

    def draw(self, plan: Plan, epoch: int, index: np.ndarray) -> Draw:
        bounds = np.asarray(self.plan.windows(epoch, index), dtype=np.int64).reshape(-1, 2)
        return plan.layout.time_draw(np.arange(index.size), bounds[:, 0], bounds[:, 1])


def as_plan(plan: WindowPlan | Plan) -> Plan:
    """``plan`` as the one plan type: a built-in plan as it is, a custom
    :class:`WindowPlan` as a plan of one piece a chunk (its ``seed`` is 0)."""
    if isinstance(plan, Plan):
        return plan
    return ModePlan(
        total_timesteps=plan.total_timesteps, chunk_size=plan.chunk_size, sampling=_Given(plan)
    )


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
    """The plan named ``sampling`` ("random", "shuffled" or "sequential"), or the
    windows of a :class:`~chunkstream.plans._sampling.Sampling` mode.

    A :class:`WindowPlan` instance is returned as it is, after checking that its
    ``total_timesteps`` and ``chunk_size`` match the ones given.
    """
    if isinstance(sampling, Sampling):
        return ModePlan(
            total_timesteps=total_timesteps,
            chunk_size=chunk_size,
            align=align,
            seed=seed,
            sampling=sampling,
        )
    if isinstance(sampling, WindowPlan):
        sizes = {"total_timesteps": sampling.total_timesteps, "chunk_size": sampling.chunk_size}
        for name, given in (("total_timesteps", total_timesteps), ("chunk_size", chunk_size)):
            if sizes[name] != given:
                raise ConfigError.bad(
                    name,
                    given,
                    f"{sizes[name]} as in the plan passed as sampling",
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
    rank, world_size = check_rank(rank, world_size)
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
