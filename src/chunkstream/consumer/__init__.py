"""The consumer side: batches of windows drawn inside a chunk, on its device, and augmentation."""

from typing import Any

from .._options import moved_name
from ._augment import neighbour_union, zero_neurons_with_neighbours
from ._batches import BatchStream
from ._options import StreamOptions
from ._sampling import gather_windows, sample_windows
from ._staggered import staggered_observations
from ._tiers import BufferInfo

# The package's internal face for the rest of chunkstream (not public API).
from ._augment import sample_batch_within_chunk as sample_batch_within_chunk  # isort: skip
from ._defaults import HOST_SHARE as HOST_SHARE  # isort: skip
from ._defaults import batch_sets_nbytes as batch_sets_nbytes  # isort: skip
from ._tiers import choose_tier as choose_tier  # isort: skip
from ._tiers import default_buffer as default_buffer  # isort: skip
from ._tiers import plan_buffer as plan_buffer  # isort: skip
from ._tiers import quality_note as quality_note  # isort: skip

__all__ = [
    "BatchStream",
    "BufferInfo",
    "StreamOptions",
    "gather_windows",
    "neighbour_union",
    "sample_windows",
    "staggered_observations",
    "zero_neurons_with_neighbours",
]

# Public until 0.x: now private, still found for one release with a FutureWarning naming
# what replaces them (name -> (private module, its name there, replacement)).
_MOVED = {
    "ChunkMixer": (
        "._mixing",
        "ChunkMixer",
        "cs.BatchStream(loader, window=..., mix=M) (its shuffle buffer of the last M chunks)",
    ),
    "WindowSampler": (
        "._sampling",
        "WindowSampler",
        "cs.sample_windows(chunk, batch_size, window) and cs.gather_windows(x, starts, window), "
        "or cs.BatchStream",
    ),
}


def moved(name: str, where: str) -> Any:
    """``name`` of :data:`_MOVED` (:func:`chunkstream._options.moved_name`)."""
    return moved_name(__name__, _MOVED, name, where)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return moved(name, "chunkstream.consumer")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
