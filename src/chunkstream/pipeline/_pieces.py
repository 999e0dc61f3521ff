"""Reading a chunk's pieces into consecutive rows of one buffer set.

:func:`loader_plan` is the loader's plan: a window plan, or a
:class:`~chunkstream.plans.PiecePlan` for pieces or segments. A pieced chunk
(``ChunkLoader(pieces=k)``) is ``k`` windows of the source laid
end to end: piece ``p`` fills rows ``[p.offset, p.offset + p.length)`` of every
field's buffer. Each piece is one ``source.read_into`` call on a row slice of
the buffer, which is C-contiguous (a leading-axis slice of a contiguous array),
so the sources' contract for their output buffer holds unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .._errors import ConfigError
from ..plans import Piece, PiecePlan, Segments, WindowPlan, make_plan
from ..sources import Source

__all__ = ["chunk_rows", "loader_plan", "piece_views", "read_pieces", "stored_time_chunk"]


def chunk_rows(pieces: Sequence[Piece]) -> int:
    """Rows the pieces fill together."""
    last = pieces[-1]
    return last.offset + last.stop - last.start


def piece_views(views: Mapping[str, np.ndarray], piece: Piece) -> dict[str, np.ndarray]:
    """The rows of ``views`` that ``piece`` fills."""
    return {name: array[piece.offset : piece.offset + piece.length] for name, array in views.items()}


def read_pieces(
    source: Source,
    pieces: Sequence[Piece],
    views: Mapping[str, np.ndarray],
    *,
    read: Callable[[Callable[[], None], Piece], None] | None = None,
) -> None:
    """Fill ``views`` with ``pieces``; ``read(call, piece)`` wraps each read (retries, checks).

    A failing piece raises with ``chunkstream_piece`` set to it, so the caller
    can name the window that failed.
    """
    for piece in pieces:
        out = piece_views(views, piece)

        def call(piece: Piece = piece, out: dict[str, np.ndarray] = out) -> None:
            source.read_into(piece.start, piece.stop, out)

        try:
            if read is None:
                call()
            else:
                read(call, piece)
        except BaseException as exc:
            exc.chunkstream_piece = piece  # type: ignore[attr-defined]
            raise


def stored_time_chunk(source: Source) -> int:
    """The source's stored time-chunk length (the zarr or tensorstore chunk grid's axis 0);
    1 when the source has no grid (numpy, callables) or it cannot be read."""
    from ..sources import TensorStoreSource, ZarrGroupSource, ZarrSource

    if isinstance(source, ZarrSource):
        return max(1, int(source.chunks[0]))
    if isinstance(source, ZarrGroupSource):
        return math.lcm(*(stored_time_chunk(part) for part in source._parts))
    if isinstance(source, TensorStoreSource):
        try:
            return max(1, int(source.store.chunk_layout.read_chunk.shape[0]))
        except (AttributeError, TypeError, IndexError, ValueError):
            return 1
    return 1


def loader_plan(
    sampling: str | WindowPlan,
    source: Source,
    total: int,
    chunk_size: int,
    align: int,
    seed: int,
    pieces: int,
    segments: object,
    window: int | None,
) -> WindowPlan | PiecePlan:
    """The loader's plan: a window plan for contiguous chunks, a :class:`PiecePlan` for
    pieces or segments (so ``pieces=1`` without segments keeps today's windows)."""
    if pieces == 1 and segments is None:
        if window is not None and isinstance(chunk_size, int) and window > min(chunk_size, total):
            raise ConfigError.bad(
                "window", window, f"at most the chunk length {min(chunk_size, total)}",
                "Use a larger chunk_size or a shorter window.",
            )  # fmt: skip
        return make_plan(
            sampling, total_timesteps=total, chunk_size=chunk_size, align=align, seed=seed
        )
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
        segments=segments, align=align, seed=seed, grid=stored_time_chunk(source),
        batch_window=1 if window is None else window,
    )  # fmt: skip
