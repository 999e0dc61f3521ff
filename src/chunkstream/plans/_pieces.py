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
plans (so resume and sharding work the same way). Pieces lie inside
:class:`~chunkstream.Segments` when given (one segment ``[0, T)`` otherwise):

* ``random`` -- each piece start uniform over all valid piece starts of all
  segments (multiples of the alignment), drawn independently, with
  replacement; segments thus weigh by their valid starts.
* ``shuffled`` -- each segment is tiled with pieces of ``P`` after a random
  phase per pass and segment; a pass visits all tiles of all segments in one
  random order, ``k`` to a chunk (the last chunk of a pass may hold fewer), so
  every tiled timestep is delivered exactly once per pass.
* ``sequential`` -- the segments' tiles in order, consecutive tiles of one
  segment merged into one piece: contiguous chunks that never cross a
  segment's end (the chunk goes on with the next segment as a new piece).

A segment shorter than a piece is one shorter piece; a segment shorter than
``batch_window`` is skipped, with one warning naming it.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .._errors import ConfigError, check_int
from ._hash import feistel, half_bits, hash_words, mix, round_keys, seed_key
from ._segments import Segments, as_segments
from ._windows import WindowPlan, _index, _span, make_plan

__all__ = ["Piece", "PiecePlan", "chunk_pieces", "epoch_pieces", "loader_plan"]

_TAG_PIECE = 0x50494543  # "PIEC"
_TAG_TILES = 0x54494C45  # "TILE"
_TAG_PHASE = 0x50484153  # "PHAS"
_SAMPLINGS = ("random", "shuffled", "sequential")


class Piece(NamedTuple):
    """Rows ``[offset, offset + stop - start)`` of a chunk hold timesteps ``[start, stop)``.

    ``segment`` is the index of the segment the piece lies in (``None`` without segments).
    """

    offset: int
    start: int
    stop: int
    segment: int | None = None

    @property
    def length(self) -> int:
        return self.stop - self.start


def chunk_pieces(plan: object, epoch: int, index: int) -> tuple[Piece, ...]:
    """The pieces of chunk ``index`` of ``epoch`` under any plan (a window plan's one window)."""
    if isinstance(plan, PiecePlan):
        return plan.chunk(epoch, index)
    start, stop = plan.window(epoch, index)  # type: ignore[attr-defined]
    return (Piece(0, start, stop, None),)


def epoch_pieces(plan: object, epoch: int, indices: Sequence[int]) -> list[tuple[Piece, ...]]:
    """:func:`chunk_pieces` of every index in ``indices``, in order; a window plan's
    windows are drawn in one vectorised call (``WindowPlan.windows``)."""
    if isinstance(plan, PiecePlan):
        return [plan.chunk(epoch, index) for index in indices]
    bounds = plan.windows(epoch, np.asarray(indices, dtype=np.int64))  # type: ignore[attr-defined]
    return [(Piece(0, start, stop, None),) for start, stop in bounds.tolist()]


def _divisors_near(chunk: int, k: int, window: object, count: int = 8) -> list[int]:
    """Up to ``count`` piece counts > 1 that divide ``chunk`` with pieces of at least
    ``window`` steps, those nearest ``k`` (by ratio), in order: the valid choices."""
    least = window if isinstance(window, int) and window >= 1 else 1
    small = [d for d in range(2, math.isqrt(chunk) + 1) if chunk % d == 0]
    valid = sorted({*small, *(chunk // d for d in small), chunk} - {1})
    valid = [d for d in valid if chunk // d >= least]
    return sorted(sorted(valid, key=lambda d: abs(math.log(d / k)))[:count])


@dataclass(frozen=True, kw_only=True)
class PiecePlan:
    """Chunks of ``pieces`` pieces of ``chunk_size // pieces`` timesteps (see the module).

    ``grid`` is the source's stored time-chunk length: piece starts are multiples
    of ``lcm(align, grid)`` when the piece length is a multiple of ``grid``, else
    of ``align``. ``batch_window`` (the batch window, default 1) must fit in a piece;
    segments shorter than it are skipped. Like the window plans it is pure and
    thread-safe; ``window(epoch, index)`` is the chunk's first piece's bounds.
    """

    total_timesteps: int
    chunk_size: int
    pieces: int = 1
    sampling: str = "shuffled"
    segments: Segments | None = None
    align: int = 1
    seed: int = 0
    grid: int = 1
    batch_window: int = 1
    _geo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total, chunk = _span(self.total_timesteps, self.chunk_size)
        k = check_int("pieces", self.pieces, 1, "Use pieces=1 for contiguous chunks.", numpy=True)
        if chunk % k:
            divisors = _divisors_near(chunk, k, self.batch_window)
            raise ConfigError.bad(
                "pieces", k, f"a divisor of chunk_size={chunk}",
                f"Use one of {divisors or [1]}, or a chunk_size that is a multiple of {k}.",
            )  # fmt: skip
        align = check_int("align", self.align, 1, "Use align=1 for no alignment.", numpy=True)
        seed = check_int("seed", self.seed, 0, "Pass a non-negative int seed.", numpy=True)
        grid = check_int(
            "grid", self.grid, 1, "Pass the stored time-chunk length, or 1.", numpy=True
        )
        window = check_int(
            "batch_window", self.batch_window, 1, "Pass the timesteps one sample needs.", numpy=True
        )
        if self.sampling not in _SAMPLINGS:
            raise ConfigError.bad(
                "sampling", self.sampling, f"one of {', '.join(map(repr, _SAMPLINGS))}",
                "A custom WindowPlan cannot be pieced; use pieces=1 with it.",
            )  # fmt: skip
        piece = chunk // k
        if window > piece:
            raise ConfigError.bad(
                "pieces", k,
                f"pieces of at least the batch window {window} (chunk_size // pieces = {piece})",
                f"Use pieces <= {max(1, chunk // window)}, a larger chunk_size or a shorter window.",
            )  # fmt: skip
        step = math.lcm(align, grid) if piece % grid == 0 else align
        if self.sampling == "shuffled" and piece % align:
            raise ConfigError.bad(
                "align", align, f"a divisor of the piece length chunk_size // pieces = {piece}",
                "Shuffled tiles must all start on an aligned timestep: change align or pieces.",
            )  # fmt: skip
        segs = (
            as_segments(self.segments, total)
            if self.segments is not None
            else Segments([(0, total, "all")])
        )
        for name, value in (
            ("total_timesteps", total), ("chunk_size", chunk), ("pieces", k), ("align", align),
            ("seed", seed), ("grid", grid), ("batch_window", window),
            ("segments", segs if self.segments is not None else None),
        ):  # fmt: skip
            object.__setattr__(self, name, value)
        self._geo.update(self._geometry(segs, piece, step, window))

    @staticmethod
    def _geometry(segs: Segments, piece: int, step: int, window: int) -> dict:
        keep = [i for i, s in enumerate(segs) if len(s) >= window]
        skipped = [s.name for s in segs if len(s) < window]
        if not keep:
            raise ConfigError.bad(
                "segments", segs, f"at least one segment of >= {window} timesteps (the window)",
                "Use longer segments or a shorter window.",
            )  # fmt: skip
        if skipped:
            warnings.warn(
                f"chunkstream: segments shorter than the batch window {window} are skipped: "
                f"{', '.join(map(repr, skipped[:10]))}" + (" ..." if len(skipped) > 10 else ""),
                stacklevel=4,
            )
        a = np.array([segs[i].start for i in keep], dtype=np.int64)
        b = np.array([segs[i].stop for i in keep], dtype=np.int64)
        # First start of each segment: the first multiple of ``step`` that leaves room
        # for a whole piece, or the segment's own start when none does.
        aligned = -(-a // step) * step
        first = np.where(aligned + piece <= b, aligned, a)
        room = np.maximum(b - first - piece, 0)
        n_starts = room // step + 1  # a short segment: one (whole, shorter) piece
        tiles = np.maximum((b - first) // piece, 1)
        n_phases = np.where((b - first) >= piece, (b - first - tiles * piece) // step + 1, 1)
        seq_tiles = -(-(b - a) // piece)
        return {
            "ids": np.array(keep, dtype=np.int64),
            "a": a, "b": b, "first": first, "piece": piece, "step": step,
            "starts_cum": np.cumsum(n_starts), "tiles": tiles,
            "tiles_cum": np.cumsum(tiles), "phases": n_phases,
            "seq_cum": np.cumsum(seq_tiles),
        }  # fmt: skip

    # -- sizes -------------------------------------------------------------------------

    @property
    def piece_size(self) -> int:
        return self.chunk_size // self.pieces

    @property
    def piece_align(self) -> int:
        """The multiple piece starts are aligned to (``random``/``shuffled``)."""
        return int(self._geo["step"])

    @property
    def windows_per_pass(self) -> int | None:
        """Chunks in one pass (``None`` for ``random``, which has no passes)."""
        if self.sampling == "random":
            return None
        cum = self._geo["seq_cum" if self.sampling == "sequential" else "tiles_cum"]
        return -(-int(cum[-1]) // self.pieces)

    def valid_starts(self) -> dict[str, int]:
        """Valid piece starts per used segment (what ``random`` weighs segments by)."""
        segs = self.segments or Segments([(0, self.total_timesteps, "all")])
        counts = np.diff(self._geo["starts_cum"], prepend=0)
        return {segs[int(i)].name: int(n) for i, n in zip(self._geo["ids"], counts, strict=True)}

    # -- the plan ----------------------------------------------------------------------

    def chunk(self, epoch: int, index: int) -> tuple[Piece, ...]:
        """The pieces of chunk ``index`` (global, across ranks) of ``epoch``."""
        epoch, index = _index("epoch", epoch), _index("index", index)
        spans = getattr(self, f"_{self.sampling}")(epoch, index)
        return self._lay_out(spans)

    def window(self, epoch: int, index: int) -> tuple[int, int]:
        """The first piece's ``(start, stop)``."""
        first = self.chunk(epoch, index)[0]
        return first.start, first.stop

    def rank_chunk(
        self, epoch: int, step: int, rank: int = 0, world_size: int = 1
    ) -> tuple[Piece, ...]:
        """Chunk ``step`` of ``rank`` out of ``world_size``: ``chunk(epoch, step * W + rank)``."""
        world_size = check_int(
            "world_size", world_size, 1, "Pass the number of ranks (>= 1).", numpy=True
        )
        rank = check_int("rank", rank, 0, f"Pass a rank in [0, world_size={world_size}).",
                         maximum=world_size - 1, numpy=True)  # fmt: skip
        return self.chunk(epoch, _index("step", step) * world_size + rank)

    def rank_window(
        self, epoch: int, step: int, rank: int = 0, world_size: int = 1
    ) -> tuple[int, int]:
        first = self.rank_chunk(epoch, step, rank, world_size)[0]
        return first.start, first.stop

    def _lay_out(self, spans: list[tuple[int, int, int]]) -> tuple[Piece, ...]:
        ids = self._geo["ids"]
        named = self.segments is not None
        out, offset = [], 0
        for start, stop, seg in spans:
            out.append(Piece(offset, start, stop, int(ids[seg]) if named else None))
            offset += stop - start
        return tuple(out)

    def _random(self, epoch: int, index: int) -> list[tuple[int, int, int]]:
        g = self._geo
        key = seed_key(self.seed)
        words = np.arange(self.pieces, dtype=np.uint64)
        h = hash_words(key, _TAG_PIECE, epoch, index, words)
        u = (h % np.uint64(int(g["starts_cum"][-1]))).astype(np.int64)
        seg = np.searchsorted(g["starts_cum"], u, side="right")
        local = u - np.concatenate(([0], g["starts_cum"]))[seg]
        starts = g["first"][seg] + local * g["step"]
        stops = np.minimum(starts + g["piece"], g["b"][seg])
        return [(int(s), int(e), int(i)) for s, e, i in zip(starts, stops, seg, strict=True)]

    def _shuffled(self, epoch: int, index: int) -> list[tuple[int, int, int]]:
        g = self._geo
        per_pass = self.windows_per_pass or 1
        n_tiles = int(g["tiles_cum"][-1])
        pass_, chunk = divmod(index, per_pass)
        positions = np.arange(chunk * self.pieces, min(n_tiles, (chunk + 1) * self.pieces))
        tile = positions.astype(np.uint64)
        base = hash_words(seed_key(self.seed), _TAG_TILES, epoch, pass_)
        if n_tiles > 1:  # a keyed Feistel permutation of the pass's tiles, with cycle walking
            bits, keys = half_bits(n_tiles), round_keys(base)
            tile = feistel(tile, bits, keys)
            out = np.flatnonzero(tile >= n_tiles)
            while out.size:
                tile[out] = feistel(tile[out], bits, keys)
                out = out[tile[out] >= n_tiles]
        tile = tile.astype(np.int64)
        seg = np.searchsorted(g["tiles_cum"], tile, side="right")
        local = tile - np.concatenate(([0], g["tiles_cum"]))[seg]
        phase_hash = hash_words(base, _TAG_PHASE, seg.astype(np.uint64))
        phase = (mix(phase_hash) % g["phases"][seg].astype(np.uint64)).astype(np.int64)
        starts = g["first"][seg] + phase * g["step"] + local * g["piece"]
        stops = np.minimum(starts + g["piece"], g["b"][seg])
        return [(int(s), int(e), int(i)) for s, e, i in zip(starts, stops, seg, strict=True)]

    def _sequential(self, epoch: int, index: int) -> list[tuple[int, int, int]]:
        del epoch
        g = self._geo
        n_tiles = int(g["seq_cum"][-1])
        chunk = index % (self.windows_per_pass or 1)
        tiles = np.arange(chunk * self.pieces, min(n_tiles, (chunk + 1) * self.pieces))
        seg = np.searchsorted(g["seq_cum"], tiles, side="right")
        local = tiles - np.concatenate(([0], g["seq_cum"]))[seg]
        starts = g["a"][seg] + local * g["piece"]
        stops = np.minimum(starts + g["piece"], g["b"][seg])
        spans: list[tuple[int, int, int]] = []
        for s, e, i in zip(starts.tolist(), stops.tolist(), seg.tolist(), strict=True):
            if spans and spans[-1][2] == i and spans[-1][1] == s:
                spans[-1] = (spans[-1][0], e, i)  # contiguous in one segment: one piece
            else:
                spans.append((s, e, i))
        return spans


def loader_plan(
    sampling: str | WindowPlan, *, total: int, chunk_size: int, align: int, seed: int,
    pieces: int, segments: object, window: int | None, grid: int,
) -> WindowPlan | PiecePlan:  # fmt: skip
    """A loader's plan: a window plan for contiguous chunks, a :class:`PiecePlan` for
    pieces or segments (``grid``: the source's stored time-chunk length). Raises
    :class:`ConfigError` naming ``window``, ``sampling`` or ``pieces``."""
    if pieces == 1 and segments is None:
        if window is not None and isinstance(chunk_size, int) and window > min(chunk_size, total):
            raise ConfigError.bad(
                "window", window, f"at most the chunk length {min(chunk_size, total)}",
                "Use a larger chunk_size or a shorter window.",
            )  # fmt: skip
        return make_plan(sampling, total_timesteps=total, chunk_size=chunk_size, align=align,
                         seed=seed)  # fmt: skip
    if not isinstance(sampling, str):
        raise ConfigError.bad(
            "sampling", type(sampling).__name__,
            "'random', 'shuffled' or 'sequential' with pieces or segments",
            "Pieces and segments need a built-in plan; use pieces=1 and no segments with a "
            "custom WindowPlan.",
        )  # fmt: skip
    if isinstance(segments, str | os.PathLike):
        segments = Segments.read(segments)
    if pieces != 1 and isinstance(chunk_size, int) and chunk_size > total:
        # Buffers hold min(chunk_size, T) rows; k pieces drawn from less data could need more.
        raise ConfigError.bad(
            "pieces", pieces, f"1 when chunk_size={chunk_size} exceeds the data ({total} timesteps)",
            "Use pieces=1 (a chunk is then the whole data) or a chunk_size <= the data.",
        )  # fmt: skip
    return PiecePlan(
        total_timesteps=total, chunk_size=chunk_size, pieces=pieces, sampling=sampling,
        segments=segments, align=align, seed=seed, grid=grid,
        batch_window=1 if window is None else window,
    )  # fmt: skip
