"""The one plan type: every plan answers "the pieces of chunk ``i`` of epoch ``e``".

A :class:`Plan` is three parts, each written once:

* a **layout** (:class:`Layout`): where pieces may lie. The segments (one
  segment ``[0, T)`` without them) are laid end to end in two virtual
  coordinates: *time order* (for ``sequential``) and *tile order*, where each
  segment at least a piece long is a line of its own, tiled with pieces after a
  phase, and the segments shorter than a piece are pooled into one last line,
  a ring cut into the fewest equal tiles that turn between passes (so a chunk
  longer than a segment holds pieces of several segments, and every segment is
  visited every pass);
* a **sampling mode** (:class:`Sampling`, the modes in :mod:`._sampling`): which
  virtual stretches chunk ``i`` of epoch ``e`` holds;
* a **stream**: the hash words (or, for the drop-in, the original's draws) the
  mode turns into choices.

A window plan is a plan whose chunks are one piece each. The contract, for
every plan: ``total_timesteps``, ``chunk_size``, ``seed`` (the hash stream's
seed), ``segments`` (``None`` without them), ``pieces``, ``piece_size`` (the
longest piece a chunk holds), ``windows_per_pass`` (``None``: no passes),
:meth:`Plan.chunk` and its vectorised form :meth:`Plan.chunks`. Plans are pure
and thread-safe: an answer depends only on the plan and its arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .._errors import ConfigError, check_int
from ._hash import hash_words, permute

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._segments import Segments

__all__ = ["Draw", "Layout", "Piece", "Plan", "Sampling", "Table", "check_rank"]

_MAX_INDEX = 2**63 - 1  # the vectorised path holds indices in int64
_TAG_OWN = 0x4F574E54  # "OWNT": a weighted line's choice of its own tiles


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


def _index(name: str, value: object) -> int:
    result = check_int(name, value, 0, f"Pass a non-negative {name}.", numpy=True)
    if result > _MAX_INDEX:
        raise ConfigError.bad(name, value, f"at most {_MAX_INDEX}", f"Pass a smaller {name}.")
    return result


def _index_array(indices: object) -> np.ndarray:
    """``indices`` as a 1-D int64 array of valid chunk indices."""
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


class Table(NamedTuple):
    """Segments laid end to end: segment ``j`` is virtual ``[v0[j], v0[j] + stop[j] - start[j])``."""

    v0: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    ids: np.ndarray

    @classmethod
    def of(cls, start: np.ndarray, stop: np.ndarray, ids: np.ndarray) -> Table:
        v0 = np.concatenate(([0], np.cumsum(stop - start)[:-1])).astype(np.int64)
        return cls(v0, start, stop, ids)

    def cut(self, owner: np.ndarray, v0: np.ndarray, v1: np.ndarray) -> tuple[np.ndarray, ...]:
        """Virtual stretches ``[v0, v1)`` as ``(owner, start, stop, segment id)`` per piece:
        a stretch over several segments is one piece in each, in order."""
        keep = v1 > v0
        owner, v0, v1 = owner[keep], v0[keep], v1[keep]
        first = np.searchsorted(self.v0, v0, side="right") - 1
        last = np.searchsorted(self.v0, v1 - 1, side="right") - 1
        counts = last - first + 1
        rep = np.repeat(np.arange(owner.size), counts)
        seg = first[rep] + np.arange(rep.size) - np.repeat(np.cumsum(counts) - counts, counts)
        lo = np.maximum(v0[rep], self.v0[seg])
        hi = np.minimum(v1[rep], self.v0[seg] + self.stop[seg] - self.start[seg])
        start = self.start[seg] + lo - self.v0[seg]
        return owner[rep], start, start + hi - lo, self.ids[seg]


class Draw(NamedTuple):
    """What a sampling mode answers: chunk ``owner`` (a position in the request) holds
    virtual ``[v0, v1)`` of ``table``, in order."""

    owner: np.ndarray
    v0: np.ndarray
    v1: np.ndarray
    table: Table


class Layout:
    """Where a plan's pieces may lie: its segments as lines of tiles and valid starts.

    ``segments``: ``(start, stop, id)`` of the segments pieces may use, in time order;
    ``piece``: the piece length; ``step``: the multiple piece starts are aligned to
    inside a segment at least a piece long. Lines: each such segment (its first
    aligned start that leaves room for a piece, else its own start; ``phases``
    places its tiles), then the pool of the shorter segments laid end to end, a ring
    cut into the fewest tiles of equal length. Sampling modes use :meth:`start_draw`,
    :meth:`tile_draw` and :meth:`time_draw`.

    ``factors`` (one float > 0 per segment, or ``None``) weighs the segments at least
    a piece long: such a line is drawn ``factor`` times as often as its length says
    (:func:`~chunkstream.plans._pieces.segment_factors`); the pool keeps its length's
    share. A weighted line's pass holds ``round(tiles * factor)`` (at least one) of its
    tiles, a keyed choice of them (:meth:`tile_draw`'s ``key``), every tile again at
    another phase where the factor is above one; ``random`` weighs its starts the same.
    """

    def __init__(
        self,
        segments: list[tuple[int, int, int]],
        piece: int,
        step: int,
        factors: Sequence[float] | None = None,
    ) -> None:
        a, b, ids = (np.array(col, dtype=np.int64) for col in zip(*segments, strict=True))
        self.piece, self.step = piece, step
        self.time = Table.of(a, b, ids)
        self.length = int((b - a).sum())
        long = (b - a) >= piece
        order = np.concatenate((np.flatnonzero(long), np.flatnonzero(~long)))
        self.tiles = Table.of(a[order], b[order], ids[order])
        la, lb = a[long], b[long]
        aligned = -(-la // step) * step
        first = np.where(aligned + piece <= lb, aligned, la)
        n_tiles = (lb - first) // piece
        pool = int((b - a)[~long].sum())
        # Per line: virtual start of its first start, its end, tiles, phases, random starts.
        self._lo = self.tiles.v0[: la.size] + first - la
        self._hi = self.tiles.v0[: la.size] + lb - la
        self.phases = (lb - first - n_tiles * piece) // step + 1
        starts = (lb - first - piece) // step + 1
        last = starts - 1
        # A line's own tiles and starts; what a pass draws of them (the same unweighted).
        self._own_tiles, self._own_starts = n_tiles.copy(), starts.copy()
        self.weighted = factors is not None
        if factors is not None:
            f = np.asarray(factors, dtype=np.float64)[order][: la.size]
            n_tiles = np.maximum(1, np.rint(n_tiles * f)).astype(np.int64)
            starts = np.maximum(1, np.rint(starts * f)).astype(np.int64)
        self._pool_tiles = -(-pool // piece)
        self._ring = np.zeros(la.size, dtype=bool)
        if pool:
            # The pool is a ring: its tiles turn by a phase of any timestep and its random
            # starts go round, so no cut between two tiles stays put from pass to pass. A
            # pool shorter than a piece is one piece, all of it; among longer segments it
            # weighs as a piece's worth of starts, so random visits it in proportion.
            self._lo = np.append(self._lo, self.length - pool)
            self._hi = np.append(self._hi, self.length)
            n_tiles = np.append(n_tiles, self._pool_tiles)
            self.phases = np.append(self.phases, pool if self._pool_tiles > 1 else 1)
            self._ring = np.append(self._ring, pool >= piece)
            ring_starts = -(-pool // step)
            last = np.append(last, ring_starts - 1 if pool >= piece else 0)
            weight = ring_starts if pool >= piece else (max(1, piece // step) if la.size else 1)
            starts = np.append(starts, weight)
            self._own_tiles = np.append(self._own_tiles, self._pool_tiles)
            self._own_starts = np.append(self._own_starts, weight)
        self._last = last
        self._tiles_cum, self._starts_cum = np.cumsum(n_tiles), np.cumsum(starts)
        self.n_tiles, self.n_starts = int(self._tiles_cum[-1]), int(self._starts_cum[-1])
        self.pooled = frozenset(ids[~long].tolist())
        #: The shortest stretch a ring's tile or random piece holds (0: no ring).
        self.ring_stretch = pool // self._pool_tiles if pool >= piece else 0
        self.ring_tiles = self._pool_tiles if pool >= piece else 0

    def starts_per_segment(self) -> dict[int, int]:
        """Per segment id, the random starts whose piece holds some of it."""
        table, n_long = self.tiles, self._lo.size - (1 if self.pooled else 0)
        counts = np.diff(np.concatenate(([0], self._starts_cum))).tolist()
        out = dict(zip(table.ids[:n_long].tolist(), counts[:n_long], strict=True))
        pool, step = int(self._hi[-1] - self._lo[-1]), self.step

        def multiples(x: int, y: int) -> int:  # of step in [x, y)
            return -(-y // step) - -(-x // step)

        for j in range(n_long, table.ids.size):  # start x holds [x, x + piece) round the ring
            lo = int(table.v0[j] - self._lo[-1])
            span = int(table.stop[j] - table.start[j]) + self.piece - 1
            if not self._ring[-1] or span >= pool:
                out[int(table.ids[j])] = counts[-1]
                continue
            first = (lo - self.piece + 1) % pool
            end = first + span
            n = multiples(first, min(end, pool)) + multiples(0, max(0, end - pool))
            out[int(table.ids[j])] = n
        return out

    def _wrap(self, owner: np.ndarray, line: np.ndarray, v0: np.ndarray, v1: np.ndarray) -> Draw:
        """Stretches past the ring's end go on at its start (two pieces)."""
        over = v1 > self._hi[line]
        if over.any():
            counts = 1 + over
            rep = np.repeat(np.arange(owner.size), counts)
            second = np.arange(rep.size) - np.repeat(np.cumsum(counts) - counts, counts) == 1
            lo, hi = self._lo[line][rep], self._hi[line][rep]
            owner, v0, v1 = (
                owner[rep],
                np.where(second, lo, v0[rep]),
                np.where(second, lo + v1[rep] - hi, np.minimum(v1[rep], hi)),
            )
        return Draw(owner, v0, v1, self.tiles)

    def tile_line(self, tile: np.ndarray) -> np.ndarray:
        """The line of each tile (``0 <= tile < n_tiles``): the index into :attr:`phases`."""
        return np.searchsorted(self._tiles_cum, tile, side="right")

    def start_draw(self, owner: np.ndarray, u: np.ndarray) -> Draw:
        """Piece start number ``u`` (``0 <= u < n_starts``, lines weighed by their starts)."""
        line = np.searchsorted(self._starts_cum, u, side="right")
        local = u - np.concatenate(([0], self._starts_cum))[line]
        if self.weighted:  # the line's draws spread evenly over its own starts
            drawn = np.diff(np.concatenate(([0], self._starts_cum)))[line]
            local = local * self._own_starts[line] // drawn
        v0 = self._lo[line] + np.minimum(local, self._last[line]) * self.step
        v1 = v0 + self.piece
        return self._wrap(
            owner, line, v0, np.where(self._ring[line], v1, np.minimum(v1, self._hi[line]))
        )

    def tile_draw(
        self,
        owner: np.ndarray,
        tile: np.ndarray,
        phase: np.ndarray | int,
        key: np.ndarray | None = None,
    ) -> Draw:
        """Tile ``tile`` (``0 <= tile < n_tiles``) of its line placed by ``phase``
        (``0 <= phase < phases[line]``): a line's tiles move by ``phase * step``, the
        pool's (the fewest of equal length, over half a piece) turn by ``phase``.
        A weighted layout's ``key`` (the pass's key per tile) picks which of a line's own
        tiles its draws are: a keyed permutation, one per round over them, each round
        at the next phase."""
        line = self.tile_line(tile)
        local = tile - np.concatenate(([0], self._tiles_cum))[line]
        phase = np.broadcast_to(np.asarray(phase, dtype=np.int64), tile.shape)
        if self.weighted and key is not None:
            local, phase = self._own_tile(line, local, phase, key)
        v0 = self._lo[line] + phase * self.step + local * self.piece
        v1 = v0 + self.piece
        if self.pooled:
            size, n = int(self._hi[-1] - self._lo[-1]), self._pool_tiles
            pool = line == self._lo.size - 1
            begin, end = local * size // n, (local + 1) * size // n
            v0 = np.where(pool, self._lo[-1] + (begin + phase) % size, v0)
            v1 = np.where(pool, v0 + end - begin, v1)
        return self._wrap(owner, line, v0, v1)

    def _own_tile(
        self, line: np.ndarray, drawn: np.ndarray, phase: np.ndarray, key: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """A weighted line's draw ``drawn`` as one of its own tiles, and its phase."""
        own = self._own_tiles[line]
        round_, within = np.divmod(drawn, own)
        local = np.empty_like(drawn)
        for j in np.unique(line).tolist():
            at = line == j
            words = hash_words(key[at], _TAG_OWN, np.uint64(j), round_[at].astype(np.uint64))
            local[at] = permute(within[at].astype(np.uint64), int(own[at][0]), words)
        return local.astype(np.int64), (phase + round_) % self.phases[line]

    def time_draw(self, owner: np.ndarray, v0: np.ndarray, v1: np.ndarray) -> Draw:
        """Virtual ``[v0, v1)`` of the segments in time order (``0 <= v0 < length``)."""
        return Draw(owner, v0, np.minimum(v1, self.length), self.time)


class Sampling:
    """A sampling mode (modes live in :mod:`._sampling`). Subclasses set ``name`` and implement
    :meth:`draw` and, for a mode with passes, :meth:`per_pass`. A mode holds no
    state: the same plan and arguments give the same draw, from any thread."""

    name: str = ""

    def per_pass(self, plan: Plan) -> int | None:
        """Chunks in one pass of ``plan`` (``None``: the mode has no passes)."""
        return None

    def draw(self, plan: Plan, epoch: int, index: np.ndarray) -> Draw:
        """What the chunks ``index`` (int64, global) of ``epoch`` hold."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Plan:
    """The one plan type (see the module). Subclasses set ``total_timesteps``,
    ``chunk_size``, ``seed`` and, in ``__post_init__``, :meth:`_set_parts`."""

    total_timesteps: int
    chunk_size: int
    seed: int
    segments: Segments | None = None
    pieces: int = 1
    layout: Layout
    mode: Sampling
    stream: object

    def _set_parts(self, layout: Layout, mode: Sampling, stream: object) -> None:
        # Frozen dataclasses: the parts are derived from the fields, never compared.
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "stream", stream)

    @property
    def piece_size(self) -> int:
        """The longest piece a chunk holds (``chunk_size // pieces``)."""
        return self.chunk_size // self.pieces

    @property
    def windows_per_pass(self) -> int | None:
        """Chunks in one pass over the data (``None`` for a mode without passes)."""
        return self.mode.per_pass(self)

    def survey_chunks(self, without_passes: int) -> int:
        """How many chunks show what one pass draws (a survey of the recordings a pass
        visits): the chunks of a pass, or ``without_passes`` for a mode without passes."""
        per_pass = self.windows_per_pass
        return int(without_passes) if per_pass is None else per_pass

    # -- the answers ---------------------------------------------------------------------

    def chunks(self, epoch: int, indices: object) -> list[tuple[Piece, ...]]:
        """The pieces of each chunk in ``indices`` (global, across ranks) of ``epoch``."""
        epoch, idx = _index("epoch", epoch), _index_array(indices)
        out: list[list[Piece]] = [[] for _ in range(idx.size)]
        if not idx.size:
            return []
        owner, start, stop, seg = self._spans(epoch, idx)
        named = self.segments is not None
        rows = zip(owner.tolist(), start.tolist(), stop.tolist(), seg.tolist(), strict=True)
        for o, s, e, g in rows:
            pieces = out[o]
            offset = pieces[-1].offset + pieces[-1].length if pieces else 0
            pieces.append(Piece(offset, s, e, g if named else None))
        return [tuple(p) for p in out]

    def chunk(self, epoch: int, index: int) -> tuple[Piece, ...]:
        """The pieces of chunk ``index`` (global, across ranks) of ``epoch``."""
        return self.chunks(epoch, np.array([_index("index", index)], dtype=np.int64))[0]

    def windows(self, epoch: int, indices: np.ndarray) -> np.ndarray:
        """``(len(indices), 2)`` int64: each chunk's first piece's ``(start, stop)``."""
        epoch, idx = _index("epoch", epoch), _index_array(indices)
        out = np.zeros((idx.size, 2), dtype=np.int64)
        if idx.size:
            owner, start, stop, _ = self._spans(epoch, idx)
            first = np.searchsorted(owner, np.arange(idx.size))
            out[:, 0], out[:, 1] = start[first], stop[first]
        return out

    def window(self, epoch: int, index: int) -> tuple[int, int]:
        """Chunk ``index``'s first piece as ``(start, stop)`` (a window plan's window)."""
        epoch, index = _index("epoch", epoch), _index("index", index)
        start, stop = self.windows(epoch, np.array([index], dtype=np.int64))[0].tolist()
        return start, stop

    def rank_window(
        self, epoch: int, step: int, rank: int = 0, world_size: int = 1
    ) -> tuple[int, int]:
        """Window ``step`` of ``rank`` out of ``world_size``: ``window(epoch, step * W + rank)``.

        Ranks get disjoint global indices and, for the same number of steps, equal counts.
        """
        return self.window(epoch, _rank_index(step, rank, world_size))

    def _spans(self, epoch: int, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        draw = self.mode.draw(self, epoch, idx)
        return draw.table.cut(draw.owner, draw.v0, draw.v1)


def check_rank(rank: object, world_size: object) -> tuple[int, int]:
    """``(rank, world_size)`` as Python ints with ``0 <= rank < world_size``, else ConfigError."""
    world_size = check_int(
        "world_size", world_size, 1, "Pass the number of ranks (>= 1).", numpy=True
    )
    rank = check_int(
        "rank",
        rank,
        0,
        f"Pass a rank in [0, world_size={world_size}).",
        maximum=world_size - 1,
        numpy=True,
    )
    return rank, world_size


def _rank_index(step: int, rank: int, world_size: int) -> int:
    rank, world_size = check_rank(rank, world_size)
    return _index("step", step) * world_size + rank
