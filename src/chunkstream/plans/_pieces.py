"""Pieced chunks: a chunk is the concatenation of ``k`` pieces from independent places.

Every batch drawn inside one contiguous chunk comes from one stretch of the
recording, so consecutive gradient steps are correlated and the model trains
worse than on i.i.d. windows. A chunk of ``k`` pieces of ``P = chunk_size // k``
timesteps each, taken from independent places, breaks that correlation at the
same read cost per byte, as long as a piece covers whole stored time chunks (the
plan aligns piece starts to the source's time-chunk grid when ``P`` is a multiple
of it; otherwise a piece decodes up to ``(P + 2 * (c - 1)) / P`` times its bytes
for a stored time chunk of ``c``).

:class:`PiecePlan` answers ``chunk(epoch, index)`` -> a tuple of :class:`Piece`,
a pure function of ``(seed, epoch, index)`` and its sizes, like the window
plans (it is the same :class:`~chunkstream.plans._plan.Plan`, so resume and
sharding work the same way). Pieces lie inside :class:`~chunkstream.Segments`
when given (one segment ``[0, T)`` otherwise); the sampling modes are in
:mod:`~chunkstream.plans._sampling`:

* ``random`` -- each piece start uniform over all valid piece starts of all
  segments (multiples of the alignment), drawn independently, with
  replacement; segments thus weigh by their valid starts.
* ``shuffled`` -- each segment is tiled with pieces of ``P`` after a random
  phase per pass and segment; a pass visits all tiles of all segments in one
  random order, ``k`` to a chunk (the last chunk of a pass may hold fewer), so
  every tiled timestep is delivered exactly once per pass.
* ``sequential`` -- the segments in time order, ``chunk_size`` timesteps a
  chunk: contiguous pieces that never cross a segment's end (the chunk goes on
  with the next segment as a new piece).

Every pass visits every segment in proportion to its length: the segments
shorter than a piece are pooled, laid end to end as a ring and cut into the
fewest tiles of equal length (at most ``P``), turned by a random phase per
pass, so a pool tile is several pieces, one in each segment it holds;
``random``'s starts go round the ring, and a pool shorter than a piece weighs
as ``P // step`` starts. A segment shorter than ``batch_window`` is skipped, with one
warning naming it.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._errors import ConfigError, check_int
from ._plan import Layout, Piece, Plan
from ._sampling import PIECE_STREAM, SAMPLINGS, Sampling, as_mode
from ._segments import Segments, as_segments
from ._windows import WindowPlan, _span, as_plan, make_plan, window_in_chunk

__all__ = ["Piece", "PiecePlan", "chunk_pieces", "epoch_pieces", "loader_plan"]


def chunk_pieces(plan: object, epoch: int, index: int) -> tuple[Piece, ...]:
    """The pieces of chunk ``index`` of ``epoch`` under any plan (a window plan's one window)."""
    return as_plan(plan).chunk(epoch, index)  # type: ignore[arg-type]


def epoch_pieces(plan: object, epoch: int, indices: Sequence[int]) -> list[tuple[Piece, ...]]:
    """:func:`chunk_pieces` of every index in ``indices``, in order, in one vectorised call."""
    return as_plan(plan).chunks(epoch, np.asarray(indices, dtype=np.int64))  # type: ignore[arg-type]


def _divisors_near(chunk: int, k: int, window: object, count: int = 8) -> list[int]:
    """Up to ``count`` piece counts > 1 that divide ``chunk`` with pieces of at least
    ``window`` steps, those nearest ``k`` (by ratio), in order: the valid choices."""
    least = window if isinstance(window, int) and window >= 1 else 1
    small = [d for d in range(2, math.isqrt(chunk) + 1) if chunk % d == 0]
    valid = sorted({*small, *(chunk // d for d in small), chunk} - {1})
    valid = [d for d in valid if chunk // d >= least]
    return sorted(sorted(valid, key=lambda d: abs(math.log(d / k)))[:count])


@dataclass(frozen=True, kw_only=True)
class PiecePlan(Plan):
    """Chunks of ``pieces`` pieces of ``chunk_size // pieces`` timesteps (see the module).

    ``grid`` is the source's stored time-chunk length: piece starts are multiples
    of ``lcm(align, grid)`` when the piece length is a multiple of ``grid``, else
    of ``align``. ``batch_window`` (the batch window, default 1) must fit in a piece;
    segments shorter than it are skipped. Like the window plans it is pure and
    thread-safe; ``window(epoch, index)`` is the chunk's first piece's bounds.
    ``sampling`` is a mode's name or a :class:`~chunkstream.plans._sampling.Sampling`.
    """

    total_timesteps: int
    chunk_size: int
    pieces: int = 1
    sampling: str | Sampling = "shuffled"
    segments: Segments | None = None
    align: int = 1
    seed: int = 0
    grid: int = 1
    batch_window: int = 1

    def __post_init__(self) -> None:
        total, chunk = _span(self.total_timesteps, self.chunk_size)
        k = check_int("pieces", self.pieces, 1, "Use pieces=1 for contiguous chunks.", numpy=True)
        if chunk % k:
            divisors = _divisors_near(chunk, k, self.batch_window)
            raise ConfigError.bad(
                "pieces",
                k,
                f"a divisor of chunk_size={chunk}",
                f"Use one of {divisors or [1]}, or a chunk_size that is a multiple of {k}.",
            )
        align = check_int("align", self.align, 1, "Use align=1 for no alignment.", numpy=True)
        seed = check_int("seed", self.seed, 0, "Pass a non-negative int seed.", numpy=True)
        grid = check_int(
            "grid", self.grid, 1, "Pass the stored time-chunk length, or 1.", numpy=True
        )
        window = check_int(
            "batch_window", self.batch_window, 1, "Pass the timesteps one sample needs.", numpy=True
        )
        if not isinstance(self.sampling, Sampling) and self.sampling not in SAMPLINGS:
            raise ConfigError.bad(
                "sampling",
                self.sampling,
                f"one of {', '.join(map(repr, SAMPLINGS))}",
                "A custom WindowPlan cannot be pieced; use pieces=1 with it.",
            )
        piece = chunk // k
        if window > piece:
            raise ConfigError.bad(
                "pieces",
                k,
                f"pieces of at least the batch window {window} (chunk_size // pieces = {piece})",
                f"Use pieces <= {max(1, chunk // window)}, a larger chunk_size or a shorter window.",
            )
        step = math.lcm(align, grid) if piece % grid == 0 else align
        if self.sampling == "shuffled" and piece % align:
            raise ConfigError.bad(
                "align",
                align,
                f"a divisor of the piece length chunk_size // pieces = {piece}",
                "Shuffled tiles must all start on an aligned timestep: change align or pieces.",
            )
        segs = (
            as_segments(self.segments, total)
            if self.segments is not None
            else Segments([(0, total, "all")])
        )
        for name, value in (
            ("total_timesteps", total),
            ("chunk_size", chunk),
            ("pieces", k),
            ("align", align),
            ("seed", seed),
            ("grid", grid),
            ("batch_window", window),
            ("segments", segs if self.segments is not None else None),
        ):
            object.__setattr__(self, name, value)
        layout = Layout(_used(segs, window), piece=piece, step=step)
        _check_pool(layout, self.sampling, k, window, segs)
        self._set_parts(layout, as_mode(self.sampling), PIECE_STREAM)

    @property
    def piece_align(self) -> int:
        """The multiple piece starts are aligned to (``random``/``shuffled``)."""
        return self.layout.step

    def valid_starts(self) -> dict[str, int]:
        """Per used segment, the piece starts whose piece holds some of it (what
        ``random`` weighs segments by; segments shorter than a piece share the pool's)."""
        segs = self.segments or Segments([(0, self.total_timesteps, "all")])
        counts = self.layout.starts_per_segment()
        return {segs[i].name: n for i, n in sorted(counts.items())}


def _check_pool(layout: Layout, sampling: object, k: int, window: int, segs: Segments) -> None:
    """Refuse pieces that could leave a chunk with no window: a stretch of the pooled
    segments over two of them holds a window only when it is at least ``2 * window - 1``
    long (``random``: a piece; ``shuffled``: a pool tile, when a chunk may hold only
    pool tiles)."""
    if not layout.ring_stretch:
        return
    if sampling == "random":
        stretch = layout.piece
    elif sampling == "shuffled":
        last = layout.n_tiles - (-(-layout.n_tiles // k) - 1) * k  # tiles of a pass's last chunk
        # some chunk may hold pool tiles only (a pass's last chunk holds the fewest)
        stretch = layout.ring_stretch if layout.ring_tiles >= last else 2 * window
    else:
        return
    if stretch >= 2 * window - 1:
        return
    short = sum(len(s) for s in segs if window <= len(s) < layout.piece)
    raise ConfigError.bad(
        "pieces",
        k,
        f"pieces that leave the segments shorter than a piece ({short} timesteps, pooled) "
        f"stretches of at least 2 * window - 1 = {2 * window - 1} (they get {stretch})",
        f"Use fewer pieces or a larger chunk_size (chunk_size // pieces >= "
        f"{2 * (2 * window - 1)}), a shorter window, or merge the short segments.",
    )


def _used(segs: Segments, window: int) -> list[tuple[int, int, int]]:
    """``(start, stop, index)`` of the segments that hold a window; one warning names
    the others (skipped), and none left is a ConfigError."""
    used = [(s.start, s.stop, i) for i, s in enumerate(segs) if len(s) >= window]
    skipped = [s.name for s in segs if len(s) < window]
    if not used:
        raise ConfigError.bad(
            "segments",
            segs,
            f"at least one segment of >= {window} timesteps (the window)",
            "Use longer segments or a shorter window.",
        )
    if skipped:
        warnings.warn(
            f"chunkstream: segments shorter than the batch window {window} are skipped: "
            f"{', '.join(map(repr, skipped[:10]))}" + (" ..." if len(skipped) > 10 else ""),
            stacklevel=4,
        )
    return used


def loader_plan(
    sampling: str | Sampling | WindowPlan,
    *,
    total: int,
    chunk_size: int,
    align: int,
    seed: int,
    pieces: int,
    segments: object,
    window: int | None,
    grid: int,
) -> Plan:
    """A loader's plan: a window plan for contiguous chunks, a :class:`PiecePlan` for
    pieces or segments (``grid``: the source's stored time-chunk length); a custom
    :class:`WindowPlan` is wrapped (:func:`~chunkstream.plans._windows.as_plan`).
    Raises :class:`ConfigError` naming ``window``, ``sampling`` or ``pieces``."""
    if pieces == 1 and segments is None:
        if window is not None and isinstance(chunk_size, int):
            window_in_chunk(window, min(chunk_size, total))
        plan = make_plan(
            sampling, total_timesteps=total, chunk_size=chunk_size, align=align, seed=seed
        )
        return as_plan(plan)
    if not isinstance(sampling, str | Sampling):
        raise ConfigError.bad(
            "sampling",
            type(sampling).__name__,
            "'random', 'shuffled' or 'sequential' with pieces or segments",
            "Pieces and segments need a built-in plan; use pieces=1 and no segments with a "
            "custom WindowPlan.",
        )
    if isinstance(segments, str | os.PathLike):
        segments = Segments.read(segments)
    if pieces != 1 and isinstance(chunk_size, int) and chunk_size > total:
        # Buffers hold min(chunk_size, T) rows; k pieces drawn from less data could need more.
        raise ConfigError.bad(
            "pieces",
            pieces,
            f"1 when chunk_size={chunk_size} exceeds the data ({total} timesteps)",
            "Use pieces=1 (a chunk is then the whole data) or a chunk_size <= the data.",
        )
    return PiecePlan(
        total_timesteps=total,
        chunk_size=chunk_size,
        pieces=pieces,
        sampling=sampling,
        segments=segments,
        align=align,
        seed=seed,
        grid=grid,
        batch_window=1 if window is None else window,
    )
