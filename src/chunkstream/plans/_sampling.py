"""Sampling modes, each written once for windows and pieces alike, and the hash streams.

A mode answers, for a plan and chunk indices of one epoch, which virtual
stretches of the plan's :class:`~chunkstream.plans._plan.Layout` each chunk
holds (a :class:`~chunkstream.plans._plan.Draw`); the plan cuts them into
pieces at segment ends. A window plan is the case of one segment and one piece
a chunk, so a new mode is one :class:`Sampling` subclass, passed as
``sampling=`` to :func:`~chunkstream.make_plan`, :class:`~chunkstream.PiecePlan`
or :class:`~chunkstream.ChunkLoader`.

* ``random`` -- each piece start uniform over the layout's valid starts (lines
  weighed by their starts), with replacement; no passes.
* ``shuffled`` -- a pass visits every tile of every line once, in one keyed
  random order (:func:`~chunkstream.plans._hash.permute`), ``pieces`` tiles a
  chunk; each line's tiles move by a random phase per pass.
* ``sequential`` -- the segments in time order, ``chunk_size`` timesteps a
  chunk; for evaluation. Ignores ``seed``.

A stream gives the modes their words. The window plans' stream (one word per
chunk, the pass's key as each line's phase word) predates pieces and is kept
bit for bit, as is the piece plans' (one word per piece, a phase word per line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ._hash import hash_words, mix, permute, seed_key
from ._plan import Draw, Sampling

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = [
    "PIECE_STREAM",
    "SAMPLINGS",
    "WINDOW_STREAM",
    "HashStream",
    "Random",
    "Sampling",
    "Sequential",
    "Shuffled",
    "as_mode",
]

_TAG_PHASE = 0x50484153  # "PHAS"


@dataclass(frozen=True)
class HashStream:
    """Words from ``(seed, epoch, index)`` by the counter-based hash (pure, thread-safe).

    ``per_piece``: a word per piece and a phase word per line (the piece plans), else
    one word per chunk and the pass's key as every line's phase word (the window plans).
    """

    random_tag: int
    shuffle_tag: int
    per_piece: bool

    def draws(self, plan: Plan, epoch: int, index: np.ndarray, n: int) -> np.ndarray:
        """``(len(index), plan.pieces)`` numbers uniform in ``[0, n)``."""
        h = hash_words(seed_key(plan.seed), self.random_tag, epoch, index.astype(np.uint64))
        h = h[:, None]
        if self.per_piece:
            h = hash_words(h, np.arange(plan.pieces, dtype=np.uint64))
        return (h % np.uint64(n)).astype(np.int64)

    def pass_key(self, plan: Plan, epoch: int, pass_: np.ndarray) -> np.ndarray:
        """One key per pass (uint64)."""
        return hash_words(seed_key(plan.seed), self.shuffle_tag, epoch, pass_.astype(np.uint64))

    def phase_word(self, key: np.ndarray, line: np.ndarray) -> np.ndarray:
        """The word that places ``line``'s tiles in the pass of ``key``."""
        return hash_words(key, _TAG_PHASE, line.astype(np.uint64)) if self.per_piece else key


WINDOW_STREAM = HashStream(random_tag=0x52414E44, shuffle_tag=0x53485546, per_piece=False)
PIECE_STREAM = HashStream(random_tag=0x50494543, shuffle_tag=0x54494C45, per_piece=True)


def slots(index: np.ndarray, pieces: int) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, slot)``: each chunk's position in ``index`` and its ``pieces`` slots,
    flattened (chunk ``c``'s slot ``j`` is ``c * pieces + j`` of its pass)."""
    owner = np.repeat(np.arange(index.size), pieces)
    return owner, np.tile(np.arange(pieces, dtype=np.int64), index.size)


class Random(Sampling):
    name = "random"

    def draw(self, plan: Plan, epoch: int, index: np.ndarray) -> Draw:
        layout = plan.layout
        u = plan.stream.draws(plan, epoch, index, layout.n_starts)
        return layout.start_draw(np.repeat(np.arange(index.size), u.shape[1]), u.ravel())


class Shuffled(Sampling):
    name = "shuffled"

    def per_pass(self, plan: Plan) -> int:
        return -(-plan.layout.n_tiles // plan.pieces)

    def draw(self, plan: Plan, epoch: int, index: np.ndarray) -> Draw:
        layout, stream = plan.layout, plan.stream
        pass_, chunk = np.divmod(index, self.per_pass(plan))
        owner, slot = slots(index, plan.pieces)
        position = chunk[owner] * plan.pieces + slot
        inside = position < layout.n_tiles  # the pass's last chunk may hold fewer tiles
        owner, position = owner[inside], position[inside]
        key = stream.pass_key(plan, epoch, pass_)[owner]
        tile = permute(position.astype(np.uint64), layout.n_tiles, key).astype(np.int64)
        line = layout.tile_line(tile)
        phases = layout.phases[line].astype(np.uint64)
        phase = (mix(stream.phase_word(key, line)) % phases).astype(np.int64)
        return layout.tile_draw(owner, tile, phase, key)


class Sequential(Sampling):
    name = "sequential"

    def per_pass(self, plan: Plan) -> int:
        return -(-plan.layout.length // plan.chunk_size)

    def draw(self, plan: Plan, epoch: int, index: np.ndarray) -> Draw:
        del epoch
        v0 = (index % self.per_pass(plan)) * plan.chunk_size
        return plan.layout.time_draw(np.arange(index.size), v0, v0 + plan.chunk_size)


SAMPLINGS: dict[str, Sampling] = {mode.name: mode for mode in (Random(), Shuffled(), Sequential())}


def as_mode(sampling: str | Sampling) -> Sampling:
    """The mode named ``sampling``, or ``sampling`` itself when it is a mode."""
    return sampling if isinstance(sampling, Sampling) else SAMPLINGS[sampling]
